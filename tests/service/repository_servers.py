"""The one way the lifecycle tests start a server with the model-repository API, and talk to it.

Every server these tests start goes through `start_repository_server`, and every stock client
through `triton_http` / `triton_grpc` (which add `CONTROL_HEADERS` to each call): where the
repository API needs credentials, they are added here and nowhere else.

`versioned_repository` lays exported directories out as `NAME/1/`, `NAME/2/`, ... in a fresh folder.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from svc_harness import RunningServer, free_port

# Headers every repository-API call carries (none needed without access control).
CONTROL_HEADERS: dict[str, str] = {}


def start_repository_server(start_server: Callable[..., RunningServer], **overrides: Any) -> RunningServer:
    """A ready server (HTTP and gRPC on free ports) with the given settings."""
    return start_server(grpc_port=free_port(), **overrides)


class _WithHeaders:
    """A stock client whose every call carries `CONTROL_HEADERS`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or not CONTROL_HEADERS or name.startswith("_"):
            return attribute
        return functools.partial(attribute, headers=dict(CONTROL_HEADERS))


def triton_http(server: RunningServer) -> Any:
    return _WithHeaders(httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}"))


def triton_grpc(server: RunningServer) -> Any:
    return _WithHeaders(grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}"))


def control_headers() -> dict[str, str]:
    """For raw HTTP calls (httpx) to the repository API."""
    return dict(CONTROL_HEADERS)


def versioned_repository(root: Path, models: dict[str, dict[int, Path]]) -> Path:
    """`root/NAME/V/` copies of the given exported directories; returns `root`."""
    for name, versions in models.items():
        for version, source in versions.items():
            add_version(root, name, version, source)
    return root


def add_version(root: Path, name: str, version: int, source: Path) -> Path:
    """Deploy `source` as version `version` of `name` the atomic way: copy beside, then one rename."""
    staging = root / f".{name}-{version}.partial"
    shutil.copytree(source, staging)
    target = root / name / str(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return target
