"""Fixtures of the tests that drive the server with Triton's own clients over both transports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

if TYPE_CHECKING:
    from support.servers import RunningServer

TRANSPORTS = ("http", "grpc")


@pytest.fixture(scope="module")
def triton_server(start_server: Any) -> RunningServer:
    """A server with gRPC on, for one test module (its statistics are the module's own traffic)."""
    from support.servers import free_port

    return start_server(grpc_port=free_port())


@pytest.fixture(scope="module")
def triton_clients(triton_server: RunningServer) -> dict[str, Any]:
    """tritonclient's HTTP and gRPC clients of `triton_server`, by transport."""
    return {
        "http": httpclient.InferenceServerClient(url=f"127.0.0.1:{triton_server.port}"),
        "grpc": grpcclient.InferenceServerClient(url=f"127.0.0.1:{triton_server.settings.grpc_port}"),
    }


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)
