"""Starting a peer on free local ports, waiting until it answers correctly, and stopping all of it.

"Ready" means a real /classify answer, not a health endpoint: frameworks report healthy before
their replica or worker has loaded the model, and the first correct answer is what the timing
needs anyway. Each peer runs in its own session (process group) and is stopped by signalling
every process of its tree, since Ray and BentoML leave helpers behind a plain kill of the root.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers.peers import REPO, Peer, Ports
from benchmarks.peers.proc import tree_pids

MODEL_ENV = "GMLP_PEER_MODEL_DIR"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def link_repository(work: Path, model_dir: Path) -> Path:
    """`work/repository`, the model repository servers are started on, holding `model_dir` as a
    link (the peers' command lines name that path)."""
    repository = work / "repository"
    repository.mkdir()
    (repository / model_dir.name).symlink_to(model_dir.resolve())
    return repository


def request_body(image: bytes, kind: str) -> tuple[bytes, str]:
    """(body, content type) of one /classify request: the raw image, or multipart field `file`."""
    if kind == "raw":
        return image, "image/jpeg"
    if kind != "multipart":
        raise ValueError(f"unknown body kind {kind!r}")
    boundary = uuid.uuid4().hex
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="image.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    return head + image + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def top_label(answer: Any) -> str:
    """The best label of a /classify answer (BentoML wraps each answer in a one-item list)."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    return str(answer["predictions"][0]["label"])


def classify(url: str, image: bytes, kind: str, timeout_s: float = 10.0) -> str:
    body, content_type = request_body(image, kind)
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return top_label(json.loads(resp.read()))


@dataclass
class Running:
    """A started peer: its root process, the URL measured and where its output goes."""

    peer: Peer
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def start(peer: Peer, work: Path, model_dir: Path) -> Running:
    ports = Ports(free_port(), tuple(free_port() for _ in range(peer.extra_ports)))
    env = {**os.environ, **peer.env, MODEL_ENV: str(model_dir), "PYTHONPATH": str(REPO)}
    log = work / f"{peer.key}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            peer.argv(peer.bin_dir(), ports, work),
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Running(peer, process, f"http://127.0.0.1:{ports.http}{peer.path}", log)


def wait_ready(server: Running, image: bytes, timeout_s: float = 180.0) -> str:
    """Poll with a real request until the peer answers; return its top label for `image`."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.peer.key} exited ({server.process.returncode}); see {server.log}")
        try:
            return classify(server.url, image, server.peer.body, timeout_s=5.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, ValueError) as exc:
            last = exc
            time.sleep(0.5)
    raise TimeoutError(f"{server.peer.key} not ready after {timeout_s:.0f} s ({last}); see {server.log}")


def stop(server: Running, grace_s: float = 15.0) -> None:
    """SIGTERM the whole tree, then SIGKILL whatever is left of it after `grace_s`."""
    pids = tree_pids(server.pid) | {server.pid}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            server.process.poll()
            alive = {pid for pid in pids if _alive(pid)}
            if not alive:
                return
            time.sleep(0.2)
        pids = alive


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def running(peer: Peer, work: Path, model_dir: Path) -> Iterator[Running]:
    server = start(peer, work, model_dir)
    try:
        yield server
    finally:
        stop(server)
