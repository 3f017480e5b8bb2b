"""Service test harness: a real uvicorn server on 127.0.0.1 in a thread, and bounded polling.

With GMLP_TEST_SERVER=granian the same app runs under Granian's embedded server instead (the HTTP
core `gmlp serve --server granian` runs in its worker), so the suite shows which guarantees hold
there (a test's own uvicorn protocol class is then ignored: the guarantee it tests is Granian's to
keep). `SERVER_ARGS` are the `gmlp serve` flags of the same choice, for tests that start the command.

Every wait is a bounded poll (a count and a time limit), never a bare sleep-and-hope.

The fixtures that start servers live in tests/service/conftest.py; this module holds what they
and the tests share (the server, the bounded poll).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from gmlp.server_process import free_port as free_port  # for the v2 tests' gRPC port
from service.app import create_app
from service.cli import server_options
from service.settings import ServiceSettings


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


# The HTTP server the service tests run the app under: uvicorn, or Granian (docs/service.md).
TEST_SERVER = os.environ.get("GMLP_TEST_SERVER", "uvicorn")
SERVER_ARGS = ["--server", TEST_SERVER]


def not_under_granian(reason: str) -> pytest.MarkDecorator:
    """Expected to fail under Granian, which cannot keep the guarantee the test checks
    (docs/service.md, "Granian (experimental)"); strict, so a Granian that keeps it is noticed."""
    return pytest.mark.xfail(TEST_SERVER == "granian", reason=f"Granian: {reason}", strict=True)


class GranianThread:
    """Granian's embedded server running `app` on an event loop of its own, in a thread; with
    `started` and `should_exit` as uvicorn.Server has them, so that RunningServer drives either."""

    def __init__(self, app: Any, settings: ServiceSettings, port: int) -> None:
        from granian.server.embed import Server

        from service.granian_server import granian_options

        options = granian_options(settings) | {"address": "127.0.0.1", "port": port, "log_level": "warning"}
        self.port = port
        self.server = Server(app, **options)
        self.loop = asyncio.new_event_loop()

    def run(self, sockets: Any = None) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    @property
    def started(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    @property
    def should_exit(self) -> bool:
        return False

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self.loop.call_soon_threadsafe(self.server.stop)


class RunningServer:
    """uvicorn.Server running `create_app(settings)` in a thread, on a socket we bound ourselves."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        graceful_timeout: int = 20,
        http: type[asyncio.Protocol] | None = None,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        """`http`: uvicorn's HTTP protocol class, when not the one the service picks;
        `client_options`: httpx.Client options of `client()` (a CA to verify, a key's headers)."""
        self.settings = settings
        self.client_options = client_options or {}
        self.app = create_app(settings)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        scheme = "https" if settings.tls_cert is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | GranianThread
        if TEST_SERVER == "granian":
            self.sock.close()  # Granian binds the port itself
            self.server = GranianThread(self.app, settings, self.port)
            self.thread = threading.Thread(target=self.server.run, daemon=True)
            return
        options = {**server_options(settings, self.app), "timeout_graceful_shutdown": graceful_timeout}
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
        with self.client(timeout=5) as client:
            wait_until(lambda: client.get("/health/ready").status_code == 200, timeout=60, interval=0.05)
        return self

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "server did not stop"

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, **self.client_options)

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
