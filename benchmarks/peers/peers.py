"""The servers compared, how each is installed and started, and the request body each one takes.

Every peer framework goes into its own virtual environment under `.bench-venvs/<venv>/` (never
the product's `.venv`): the framework at a pinned version, plus the product's own pins of the
packages that decide the measured work (onnxruntime, numpy, Pillow, simplejpeg, tokenizers, from
constraints.txt) and this repository installed editable without extras for `contract`. gmlp-serve
itself runs from the environment the benchmark runs in (the product's `.venv` under `make`).

A peer is "ready" at its first real /classify answer, not at a health endpoint: frameworks report
healthy before their replica or worker has loaded the model, and the first correct answer is what
the timing needs anyway. Each runs as a `gmlp.server_process.ServerProcess`, in its own session,
stopped by signalling every process of its tree, since Ray and BentoML leave helpers behind a
plain kill of the root.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO
from benchmarks.peers.model import MAX_BATCH, MAX_WAIT_S, MODEL_ENV, instances, intra_op_threads
from gmlp.server_process import ServerProcess, free_port, get_json, serve_argv
from loadtests.workload import jpeg_body

VENVS = REPO / ".bench-venvs"
# The packages whose versions decide the work every server does, pinned as the product pins them.
SHARED_PINS = ("onnxruntime", "numpy", "pillow", "simplejpeg", "tokenizers")

LITSERVE = "litserve==0.2.19"
RAY = "ray[serve]==2.60.0"
BENTOML = "bentoml==1.4.40"
# LitServe parses forms only when python-multipart is installed; pinned as the product pins it.
MULTIPART = "python-multipart"


@dataclass(frozen=True)
class Peer:
    """One measured server configuration."""

    key: str
    label: str
    venv: str | None  # None: the product's .venv
    packages: tuple[str, ...]
    # (python or venv bin dir, free ports: the measured one first, then `extra_ports`, work dir) -> argv
    argv: Callable[[Path, list[int], Path], list[str]]
    body: str  # "raw" (image/jpeg body) or "multipart" (field `file`)
    extra_ports: int = 0
    env: dict[str, str] = field(default_factory=dict)

    def bin_dir(self) -> Path:
        return VENVS / self.venv / "bin" if self.venv else Path(sys.executable).parent


def gmlp_layout(workers: bool = True) -> list[str]:
    """`gmlp serve` flags of the layout every peer is given: the int8 file, the run's instances in
    the engine process with as many front-end processes (as BentoML's and LitServe's workers are
    processes), the peers' batch limits. `workers=False`: the same instances in one process, whose
    one event loop then carries every request (what the profile reads)."""
    processes = instances() if workers else 1
    return [
        *("--variant", "int8", "--workers", str(processes), "--instances", str(instances())),
        *("--intra-op-threads", str(intra_op_threads()), "--max-batch-size", str(MAX_BATCH)),
        *("--max-queue-delay-ms", f"{MAX_WAIT_S * 1000:g}"),
    ]


def gmlp_argv(bin_dir: Path, ports: list[int], work: Path, *, workers: bool = True) -> list[str]:
    return serve_argv(work / "repository", ports[0], *gmlp_layout(workers), "--log-level", "warning")


def _litserve(bin_dir: Path, ports: list[int], work: Path) -> list[str]:
    return [str(bin_dir / "python"), "-m", "benchmarks.peers.litserve_server", "--port", str(ports[0])]


def _ray(bin_dir: Path, ports: list[int], work: Path) -> list[str]:
    """Ray Serve with direct ingress: the measured port is the replica's own, not the proxy's."""
    http, proxy, grpc = ports
    return [
        *(str(bin_dir / "python"), "-m", "benchmarks.peers.ray_server", "--temp-dir", str(work / "ray")),
        *("--port", str(proxy), "--direct-port", str(http), "--direct-grpc-port", str(grpc)),
    ]


def _bentoml(bin_dir: Path, ports: list[int], work: Path) -> list[str]:
    service = "benchmarks.peers.bentoml_service:Classifier"
    return [str(bin_dir / "bentoml"), "serve", service, "--host", "127.0.0.1", "--port", str(ports[0])]


PEERS: tuple[Peer, ...] = (
    Peer("gmlp-serve", "gmlp-serve", None, (), gmlp_argv, "raw"),
    Peer("gmlp-serve-multipart", "gmlp-serve (multipart)", None, (), gmlp_argv, "multipart"),
    Peer("litserve", "LitServe 0.2.19", "litserve", (LITSERVE, MULTIPART), _litserve, "multipart"),
    Peer("ray-direct", "Ray Serve 2.60 (direct ingress)", "ray", (RAY,), _ray, "raw", extra_ports=2),
    Peer(
        *("bentoml", "BentoML 1.4.40 (batchable API)", "bentoml", (BENTOML,), _bentoml, "multipart"),
        env={"BENTOML_DO_NOT_TRACK": "True"},
    ),
)
PEER_KEYS = tuple(p.key for p in PEERS)


def gmlp_also(name: str, flags: str) -> Peer:
    """One more gmlp-serve row, `gmlp-serve-NAME`: the peers' layout with `flags` of `gmlp serve`
    after it, where a flag given again wins (`--backend openvino --variant fp32`, `--lone-threads 0`)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
        raise ValueError(f"row name {name!r}: lower-case letters, digits and '-', at most 31")
    extra = shlex.split(flags)

    def argv(bin_dir: Path, ports: list[int], work: Path) -> list[str]:
        return [*gmlp_argv(bin_dir, ports, work), *extra]

    return Peer(f"gmlp-serve-{name}", f"gmlp-serve ({' '.join(extra)})", None, (), argv, "raw")


def product_pins(names: tuple[str, ...], constraints: Path = REPO / "constraints.txt") -> list[str]:
    """`name==version` for each of `names` as constraints.txt pins it (raises if one is missing)."""
    pins = {}
    for line in constraints.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = f"{match.group(1)}=={match.group(2)}"
    missing = [n for n in names if n.lower() not in pins]
    if missing:
        raise SystemExit(f"constraints.txt pins none of {missing}")
    return [pins[n.lower()] for n in names]


def install_spec(peer: Peer) -> list[str]:
    """What pip installs into the peer's venv: its framework, the product's pins of the shared
    packages and of the peer's unversioned ones, and the repository last (editable, no extras). A
    shared package the peer pins itself (a framework that refuses the product's version) keeps the
    peer's pin."""
    plain = [p for p in peer.packages if "==" in p]
    unpinned = tuple(p for p in peer.packages if "==" not in p)
    own = {re.split(r"[\[=]", p, maxsplit=1)[0].lower() for p in plain}
    shared = tuple(n for n in SHARED_PINS if n not in own)
    return [*plain, *product_pins(shared + unpinned), "-e", str(REPO)]


def ensure_venv(peer: Peer) -> None:
    """Create or update the peer's venv; a marker holding the install spec skips repeat installs."""
    if peer.venv is None:
        return
    spec = install_spec(peer)
    root = VENVS / peer.venv
    marker = root / ".installed"
    if marker.exists() and marker.read_text() == "\n".join(spec):
        return
    print(f"installing {peer.venv} into {root} (once): {' '.join(spec)}", flush=True)
    if not (root / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *spec], check=True)
    marker.write_text("\n".join(spec))


def request_body(image: bytes, kind: str) -> tuple[bytes, str]:
    """(body, content type) of one /classify request: the raw image, or multipart field `file`."""
    if kind not in ("raw", "multipart"):
        raise ValueError(f"unknown body kind {kind!r}")
    return jpeg_body(image, kind == "multipart")


def top_label(answer: Any) -> str:
    """The best label of a /classify answer (BentoML wraps each answer in a one-item list)."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    return str(answer["predictions"][0]["label"])


def classify(url: str, image: bytes, kind: str, timeout_s: float = 10.0) -> str:
    body, content_type = request_body(image, kind)
    return top_label(get_json(url, timeout_s, {"Content-Type": content_type}, body))


@contextlib.contextmanager
def running(
    peer: Peer,
    work: Path,
    model_dir: Path,
    ready: Callable[[ServerProcess], object],
    ports: list[int] | None = None,
) -> Iterator[ServerProcess]:
    """`peer` started from the checkout (the peers' own servers are modules of it) on `ports` (default:
    free ones) until `ready(server)` answers; stopped with its whole tree after. Its `url` is the
    route measured."""
    ports = ports or [free_port() for _ in range(1 + peer.extra_ports)]
    server = ServerProcess(
        peer.argv(peer.bin_dir(), ports, work),
        port=ports[0],
        path="/classify",
        log_path=work / f"{peer.key}.log",
        env={**peer.env, MODEL_ENV: str(model_dir), "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    server.start()
    try:
        server.wait_ready(lambda: ready(server), timeout_s=240.0)
        yield server
    finally:
        server.stop(grace_s=15.0)
