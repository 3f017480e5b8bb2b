"""Service test harness: a real uvicorn server on 127.0.0.1 in a thread, and bounded polling.

Every wait is a bounded poll (a count and a time limit), never a bare sleep-and-hope.

The fixtures that start servers live in tests/service/conftest.py; this module holds what they
and the tests share (the server, the bounded poll).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from gmlp.server_process import free_port as free_port  # for the v2 tests' gRPC port
from service.app import create_app
from service.server import server_options
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
