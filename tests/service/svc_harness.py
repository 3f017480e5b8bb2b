"""Service test harness: a real uvicorn server on 127.0.0.1 in a thread, bounded polling, fixtures.

The served models are the session fixtures `tiny_vision_served` / `tiny_mlm_served` of
tests/conftest.py (real exports of tiny random-weight models; their parent is the repository).
Every wait is a bounded poll (a count and a time limit), never a bare sleep-and-hope.

Test modules load this as a plugin (`pytest_plugins = ["svc_harness"]`) instead of a
tests/service/conftest.py: a second module named `conftest` would shadow tests/conftest.py for the
tests that do `from helpers import ...`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import free_port as free_port  # for the v2 tests' gRPC port
from service.app import create_app
from service.cli import server_options
from service.core.settings import ServiceSettings


def wait_until(condition: Callable[[], bool], *, timeout: float = 20.0, interval: float = 0.02) -> None:
    """Poll `condition` until true; fail after `timeout` seconds (and a matching number of tries)."""
    tries = int(timeout / interval) + 1
    deadline = time.monotonic() + timeout
    for _ in range(tries):
        if condition():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


class RunningServer:
    """uvicorn.Server running `create_app(settings)` in a thread, on a socket we bound ourselves."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        graceful_timeout: int = 20,
        http: type[asyncio.Protocol] | None = None,
    ) -> None:
        """`http`: uvicorn's HTTP protocol class, when not the one the service picks."""
        self.settings = settings
        self.app = create_app(settings)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        options = {**server_options(settings), "timeout_graceful_shutdown": graceful_timeout}
        if http is not None:
            options["http"] = http
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False, **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> RunningServer:
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30)
        return self

    def wait_ready(self) -> RunningServer:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            wait_until(lambda: client.get("/health/ready").status_code == 200, timeout=60, interval=0.05)
        return self

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "server did not stop"

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Current samples as {(name, sorted labels): value}."""
        with self.client() as client:
            text = client.get("/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """Bounded poll (`wait_until`), as a method so test modules need not import this module."""
        wait_until(condition, timeout=timeout)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)


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
        **overrides: object,
    ) -> RunningServer:
        """`prepare(app)` runs before the server starts (a test adding a route of its own)."""
        server = RunningServer(make_settings(**overrides), http=http)
        if prepare is not None:
            prepare(server.app)
        servers.append(server.start())
        return server.wait_ready()

    yield start
    for server in servers:
        if server.thread.is_alive():
            server.stop()
