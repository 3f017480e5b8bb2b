"""Keys rotate without a restart: added, removed and a broken file, under a bounded load with a
valid key that must never fail, whether the file is replaced or rewritten in place; SIGHUP re-reads
at once; no key ever reaches a log line or metric."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from service.access.keys import SETTLE_S, new_key
from support.keys import bearer, keys_file_text, replace_file

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[3]


class Load:
    """A client sending GET /models with a valid key until stopped (bounded in count and time)."""

    def __init__(self, url: str, key: str, limit: int = 20_000) -> None:
        self.url, self.key, self.limit = url, key, limit
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30, headers=bearer(self.key)) as client:
            while not self.stop.is_set() and len(self.statuses) < self.limit:
                self.statuses.append(client.get("/models").status_code)
                self.stop.wait(0.005)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def _status(server: RunningServer, key: str) -> int:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        return client.get("/models", headers=bearer(key)).status_code


def test_keys_rotate_under_load_and_a_broken_file_changes_nothing(
    start_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "keys"
    keys = {"steady": new_key(), "old": new_key(), "ops": new_key()}
    scopes = {"steady": "infer", "old": "infer", "new": "infer", "ops": "metrics"}
    replace_file(path, keys_file_text(keys, scopes))
    server = start_server(
        api_keys_file=path, reload_interval_s=0.1, client_options={"headers": bearer(keys["ops"])}
    )
    fresh = new_key()
    assert _status(server, fresh) == 401 and _status(server, keys["old"]) == 200
    with Load(server.url, keys["steady"]) as load:
        # Add a key: it works within the reload interval.
        keys["new"] = fresh
        replace_file(path, keys_file_text(keys, scopes))
        server.wait_for(lambda: _status(server, fresh) == 200)
        # Remove one: refused from then on.
        old = keys.pop("old")
        replace_file(path, keys_file_text(keys, scopes))
        server.wait_for(lambda: _status(server, old) == 401)
        # Break the file (a key pasted in plain, by mistake): the keys in force stay.
        errors = server.metric("gmlp_file_reloads_total", file="api_keys", result="error")
        pasted = new_key()
        replace_file(path, keys_file_text(keys, scopes) + f"broken infer {pasted}\n")
        server.wait_for(
            lambda: server.metric("gmlp_file_reloads_total", file="api_keys", result="error") > errors
        )
        assert (
            _status(server, fresh) == 200 and _status(server, old) == 401 and _status(server, pasted) == 401
        )
        server.wait_for(lambda: len(load.statuses) > 20)
    assert load.statuses and set(load.statuses) == {200}, "a request with a valid key failed"
    assert "line 5" in caplog.text and "sha256:<64 hex digits>" in caplog.text  # the log says why
    with server.client() as client:
        exposition = client.get("/metrics").text
    for key in (*keys.values(), old, pasted):
        assert key not in caplog.text and key not in exposition


def test_sighup_rereads_the_keys_at_once(repository: Path, tmp_path: Path, poll: Any) -> None:
    from support.servers import free_port

    path = tmp_path / "keys"
    first, second = new_key(), new_key()
    replace_file(path, keys_file_text({"first": first}, {"first": "infer"}))
    port = free_port()
    env = {
        **os.environ,
        "GMLP_MODEL_REPOSITORY": str(repository),
        "GMLP_CHECKPOINT_DIR": "",
        "GMLP_PORT": str(port),
        "GMLP_GRPC_PORT": "0",
        "GMLP_INTRA_OP_THREADS": "1",
        "GMLP_API_KEYS_FILE": str(path),
        "GMLP_RELOAD_INTERVAL_S": "3600",  # only SIGHUP re-reads within the test
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def status(key: str) -> int:
        try:
            return httpx.get(f"{url}/models", headers=bearer(key), timeout=5).status_code
        except httpx.TransportError:
            return 0

    try:
        poll(lambda: status(first) == 200, timeout=120, interval=0.2)
        replace_file(path, keys_file_text({"second": second}, {"second": "infer"}))
        assert status(second) == 401  # not re-read yet: the interval is an hour
        process.send_signal(signal.SIGHUP)
        poll(lambda: status(second) == 200, timeout=30, interval=0.1)
        assert status(first) == 401
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0].decode()
    assert "API keys loaded" in output and first not in output and second not in output


def _write_in_place(path: Path, text: str, pause: float) -> None:
    """Rewrite `path` as many tools do: truncate it, then write it a line at a time."""
    with path.open("w") as handle:
        for line in text.splitlines(keepends=True):
            handle.write(line)
            handle.flush()
            time.sleep(pause)


def test_a_keys_file_rewritten_in_place_never_drops_a_valid_key(
    start_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncate-then-slow-write rewrites, in a bounded loop, while a client sends a valid key every
    few milliseconds and the watcher looks every 20 ms: not one 401. A removal made in place still
    applies once the file reads the same; a file left empty keeps the keys, a comment empties it."""
    caplog.set_level(logging.INFO)
    path = tmp_path / "keys"
    keys = {"steady": new_key(), "old": new_key(), "ops": new_key()}
    scopes = {"steady": "infer", "old": "infer", "ops": "metrics"}
    text = keys_file_text(keys, scopes)
    replace_file(path, text)
    server = start_server(
        api_keys_file=path, reload_interval_s=0.02, client_options={"headers": bearer(keys["ops"])}
    )
    with Load(server.url, keys["steady"]) as load:
        deadline = time.monotonic() + 6
        rounds = 0
        while time.monotonic() < deadline and rounds < 40:
            _write_in_place(path, text, pause=0.03)
            rounds += 1
            time.sleep(0.05)
        server.wait_for(lambda: len(load.statuses) > 100)
        # A removal written in place applies once the file has settled.
        old = keys.pop("old")
        _write_in_place(path, keys_file_text(keys, scopes), pause=0.03)
        server.wait_for(lambda: _status(server, old) == 401)
        # Left empty (truncated, never written): the keys in force stay, and the log says why.
        path.write_text("")
        time.sleep(SETTLE_S + 0.5)
        assert _status(server, keys["steady"]) == 200
    assert rounds >= 5 and load.statuses and set(load.statuses) == {200}, (
        f"{load.statuses.count(401)} of {len(load.statuses)} valid-key requests refused"
    )
    assert "reads empty" in caplog.text and "# no keys" in caplog.text
    # Emptied on purpose: a comment line, written in place, locks the service once it settles.
    path.write_text("# no keys\n")
    server.wait_for(lambda: _status(server, keys["steady"]) == 401)
