"""Starting a peer on free local ports, waiting until it answers correctly, and stopping all of it.

"Ready" means a real /classify answer, not a health endpoint: frameworks report healthy before
their replica or worker has loaded the model, and the first correct answer is what the timing
needs anyway. Each peer is a `gmlp.server_process.ServerProcess`: its own session, stopped by
signalling every process of its tree, since Ray and BentoML leave helpers behind a plain kill of
the root.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO
from benchmarks.peers.model import MODEL_ENV
from benchmarks.peers.peers import Peer, Ports
from gmlp.server_process import ServerProcess, free_port
from loadtests.workload import multipart_body


def request_body(image: bytes, kind: str) -> tuple[bytes, str]:
    """(body, content type) of one /classify request: the raw image, or multipart field `file`."""
    if kind == "raw":
        return image, "image/jpeg"
    if kind != "multipart":
        raise ValueError(f"unknown body kind {kind!r}")
    return multipart_body(image, "image.jpg", "image/jpeg")


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


@contextlib.contextmanager
def running(peer: Peer, work: Path, model_dir: Path, image: bytes) -> Iterator[ServerProcess]:
    """`peer` started from the checkout (the peers' own servers are modules of it) on free ports
    and answering `image`; stopped with its whole tree after. Its `url` is the route measured."""
    ports = Ports(free_port(), tuple(free_port() for _ in range(peer.extra_ports)))
    server = ServerProcess(
        peer.argv(peer.bin_dir(), ports, work),
        port=ports.http,
        path="/classify",
        log_path=work / f"{peer.key}.log",
        env={**peer.env, MODEL_ENV: str(model_dir), "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    server.start()
    try:
        server.wait_ready(lambda: classify(server.url, image, peer.body, timeout_s=5.0), timeout_s=180.0)
        yield server
    finally:
        server.stop(grace_s=15.0)
