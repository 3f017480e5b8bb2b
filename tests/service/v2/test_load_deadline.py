"""A load or warm-up that never ends, on real servers: a graph whose every run loops 10^15 times
(support/endless_graph.py). Past `load_timeout_s` its load is abandoned (its run terminated, its
thread ended) and the version listed UNAVAILABLE with the reason, while the other models serve;
SIGTERM ends a server whatever its loads are doing."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmlp.server_process import free_port, serve_argv
from support.endless_graph import endless_warm_up
from support.repository_servers import (
    add_version,
    start_repository_server,
    version_reasons,
    versioned_repository,
)

pytestmark = pytest.mark.timeout(240)


def _load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gmlp-load")]


def test_a_load_past_its_deadline_is_abandoned_and_listed(
    start_server: Any, tmp_path: Path, tiny_vision_served: Path, cifar_images: list[bytes]
) -> None:
    """A version deployed into a polled repository whose warm-up never ends: UNAVAILABLE with the
    reason once `load_timeout_s` has passed, its load's thread ended, the serving model answering
    and the server ready throughout."""
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    server = start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1, load_timeout_s=2.0
    )
    add_version(repo, "endless", 1, endless_warm_up(tiny_vision_served, tmp_path / "endless"))
    server.wait_for(lambda: "did not finish" in version_reasons(server, "endless").get("1", ""), 60)
    reason = version_reasons(server, "endless")["1"]
    assert "did not finish within 2 s" in reason and "load_timeout_s" in reason, reason
    with server.client() as client:
        assert client.post("/classify", content=cifar_images[0]).status_code == 200
        assert client.get("/health/ready").status_code == 200
    # The abandoned load's run was terminated: its thread ends, nothing keeps burning a core.
    deadline = time.monotonic() + 30
    while _load_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _load_threads() == []


def test_sigterm_ends_a_server_whose_load_never_ends(tmp_path: Path, tiny_vision_served: Path) -> None:
    repo = versioned_repository(
        tmp_path / "models", {"endless": {1: endless_warm_up(tiny_vision_served, tmp_path / "e")}}
    )
    port = free_port()
    flags = ("--load-timeout-s", "3600", "--request-timeout-s", "5", "--drain-timeout-s", "2")
    with (tmp_path / "server.log").open("wb") as log:
        process = subprocess.Popen(serve_argv(repo, port, *flags), stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/health/live", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert httpx.get(f"{url}/health/ready", timeout=2.0).status_code == 503  # still loading
        time.sleep(1.0)  # well inside the endless warm-up
        process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down: "killed by SIGTERM" is a clean stop.
        status = process.wait(timeout=60)
        log = (tmp_path / "server.log").read_text()
        assert status in (0, -signal.SIGTERM), log[-3000:]
        # Stopped, not merely killed with the process: shutdown abandoned the load, whose run
        # ONNX Runtime then ended (its native log line), so no thread outlives the service.
        assert "terminate flag" in log, log[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
