"""`gmlp serve` under a descriptor limit of 1024 (soft and hard, as many systems start a process):
its connection caps are lowered to fit, with a warning naming them, so that a flood of idle gRPC
connections is refused at gRPC's cap and HTTP still accepts and answers."""

from __future__ import annotations

import contextlib
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmlp.server_process import HOST, ServerProcess, free_port, link_repository, serve_argv

LIMIT = 1024
FLOOD = 1000  # idle connections to the gRPC port: the default cap, which 1024 descriptors cannot hold


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """This test process may hold the flood's sockets (its soft limit raised toward the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLOOD + 256
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard descriptor limit {hard} is below the {wanted} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_caps_fit_a_1024_descriptor_limit_and_http_answers_through_a_grpc_flood(
    tmp_path: Path, tiny_vision_served: Path, many_descriptors: None
) -> None:
    port, grpc_port = free_port(), free_port()
    argv = [
        *("prlimit", f"--nofile={LIMIT}:{LIMIT}"),
        # Unanswered connections stay open for the whole test (not closed by the handshake limit).
        *serve_argv(link_repository(tmp_path, tiny_vision_served), port, "--header-timeout-s", "120"),
        *("--grpc-port", str(grpc_port)),
    ]
    with ServerProcess(argv, port=port, log_path=tmp_path / "serve.log") as server:
        warnings = [line for line in server.log_tail(200_000).splitlines() if "ulimit -n" in line]
        assert len(warnings) == 1, server.log_tail()
        assert f"is {LIMIT} (hard limit {LIMIT}), too few for max_connections=1000" in warnings[0]
        assert "serving with max_connections=298 and grpc_max_connections=298" in warnings[0]
        with contextlib.ExitStack() as held:
            for _ in range(FLOOD):
                with contextlib.suppress(OSError):  # a full accept queue: the flood is big enough
                    held.enter_context(socket.create_connection((HOST, grpc_port), timeout=2))
            assert server.wait_ready(server.health, timeout_s=30)  # HTTP accepts and answers
        assert "Too many open files" not in server.log_tail(200_000)
