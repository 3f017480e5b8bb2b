"""Start `gmlp serve` as a child process on 127.0.0.1 and a free port, bounded in time.

The benchmark compares server settings (batching on and off), so it must own the server's
lifetime; the test suite needs a real server, not a stand-in. Both use this one helper, which
always stops what it started (SIGTERM, then SIGKILL) and shows the server's log when it dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from loadtests.metrics_scrape import http_get


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`python -m gmlp serve` on 127.0.0.1; use as a context manager (started and ready inside)."""

    def __init__(
        self,
        repository: Path,
        *,
        log_path: Path,
        serve_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90.0,
    ) -> None:
        self.repository = repository
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve_args = list(serve_args)
        self.env = dict(env or {})
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gmlp",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model-repository",
            str(self.repository),
            # Serve exactly the repository: never export ./checkpoints into it.
            "--checkpoint-dir",
            "",
            # HTTP only: a fixed gRPC port would clash between runs on one machine.
            "--grpc-port",
            "0",
            *self.serve_args,
        ]

    def start(self) -> None:
        env = {**os.environ, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.command(), env=env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()  # __exit__ does not run when __enter__ raises
            raise

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self) -> None:
        """Poll /health/ready until 200; fail early if the process exits, late if it never gets ready."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gmlp serve exited with {self.proc.returncode} before it was ready:\n{self.log_tail()}"
                )
            try:
                http_get(f"{self.url}/health/ready", timeout_s=2.0)
                return
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(
            f"gmlp serve was not ready within {self.ready_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (the server drains), then SIGKILL if it takes longer than `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["ServerProcess", "free_port"]
