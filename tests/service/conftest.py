"""Fixtures of the service tests: settings over the tiny served models, and real servers.

The served models are the session fixtures `tiny_vision_served` / `tiny_mlm_served` of
tests/conftest.py (real exports of tiny random-weight models; their parent is the repository).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from service.settings import ServiceSettings
from support.servers import RunningServer, wait_until


@pytest.fixture(scope="session")
def poll() -> Callable[..., None]:
    """`wait_until`, for tests that wait on something other than a RunningServer (a process)."""
    return wait_until


@pytest.fixture(scope="session")
def repository(tiny_vision_served: Path, tiny_mlm_served: Path) -> Path:
    """The repository holding both tiny served models."""
    assert tiny_vision_served.parent == tiny_mlm_served.parent
    return tiny_vision_served.parent


@pytest.fixture(scope="session")
def make_settings(repository: Path) -> Callable[..., ServiceSettings]:
    def make(**overrides: object) -> ServiceSettings:
        base: dict[str, object] = {
            "model_repository": repository,
            "checkpoint_dir": None,
            "intra_op_threads": 1,
            "max_batch_size": 8,
            "max_queue_delay_ms": 5.0,
            "request_timeout_s": 30.0,
            # gRPC only where a test asks for it (with a free port): the default port is fixed.
            "grpc_port": 0,
        }
        return ServiceSettings(**{**base, **overrides})

    return make


@pytest.fixture(scope="session")
def start_server(make_settings: Callable[..., ServiceSettings]) -> Iterator[Callable[..., RunningServer]]:
    """Factory: start a ready server with setting overrides; all are stopped at the end."""
    servers: list[RunningServer] = []

    def start(
        *,
        http: type[asyncio.Protocol] | None = None,
        prepare: Callable[[FastAPI], None] | None = None,
        client_options: dict[str, Any] | None = None,
        **overrides: object,
    ) -> RunningServer:
        """`prepare(app)` runs before the server starts (a test adding a route of its own);
        `client_options`: the options of the server's own httpx clients (TLS, a key's headers)."""
        server = RunningServer(make_settings(**overrides), http=http, client_options=client_options)
        if prepare is not None:
            prepare(server.app)
        servers.append(server.start())
        return server.wait_ready()

    yield start
    for server in servers:
        if server.thread.is_alive():
            server.stop()


@pytest.fixture(scope="session")
def tiny_vision_v2_served(tmp_path_factory: pytest.TempPathFactory, tiny_vision_served: Path) -> Path:
    """The tiny classifier retrained: the same architecture, labels and preprocessing as
    `tiny_vision_served`, other weights (so its answers tell the versions apart); fp32 only."""
    import torch

    from export import export_served_model
    from model import build_model, save_checkpoint
    from support.helpers import CIFAR_LABELS, tiny_vision_config

    torch.manual_seed(1)
    config = tiny_vision_config()
    model = build_model(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape) * 0.1)
    root = tmp_path_factory.mktemp("vision-v2")
    save_checkpoint(model, root / "checkpoint", labels=CIFAR_LABELS[: config.num_classes])
    export_served_model(root / "checkpoint", root / "tiny-vision", ["fp32"])
    return root / "tiny-vision"
