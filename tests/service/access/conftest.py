"""Fixtures of the access-control tests: a keys file, a test CA, and requests of every route family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support.certs import TestCA
from support.keys import write_keys

# The keys every keyed server of these tests holds: one per scope, and one with every scope.
SCOPES = {"client": "infer", "ops": "metrics", "admin": "admin", "all": "infer,metrics,admin"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    return path, write_keys(path, **SCOPES)


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def grpc_port() -> Callable[[], int]:
    from support.servers import free_port

    return free_port
