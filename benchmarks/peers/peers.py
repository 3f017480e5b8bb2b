"""The servers compared, how each is installed and started, and the request body each one takes.

Every peer framework goes into its own virtual environment under `.bench-venvs/<venv>/` (never
the product's `.venv`): the framework at a pinned version, plus the product's own pins of the
packages that decide the measured work (onnxruntime, numpy, Pillow, simplejpeg, tokenizers, from
constraints.txt) and this repository installed editable without extras for `contract`. gmlp-serve
itself runs from the environment the benchmark runs in (the product's `.venv` under `make`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import REPO
from benchmarks.peers.model import instances, intra_op_threads
from gmlp.server_process import serve_argv

VENVS = REPO / ".bench-venvs"
# The packages whose versions decide the work every server does, pinned as the product pins them.
SHARED_PINS = ("onnxruntime", "numpy", "pillow", "simplejpeg", "tokenizers")

LITSERVE = "litserve==0.2.19"
RAY = "ray[serve]==2.60.0"
BENTOML = "bentoml==1.4.40"
# LitServe parses forms only when python-multipart is installed; pinned as the product pins it.
MULTIPART = "python-multipart"


@dataclass(frozen=True)
class Ports:
    """The free ports a peer is started on: `http` is the one measured."""

    http: int
    extra: tuple[int, ...] = ()


@dataclass(frozen=True)
class Peer:
    """One measured server configuration."""

    key: str
    label: str
    venv: str | None  # None: the product's .venv
    packages: tuple[str, ...]
    argv: Callable[[Path, Ports, Path], list[str]]  # (python or venv bin dir, ports, work dir) -> argv
    body: str  # "raw" (image/jpeg body) or "multipart" (field `file`)
    extra_ports: int = 0
    env: dict[str, str] = field(default_factory=dict)

    def bin_dir(self) -> Path:
        return VENVS / self.venv / "bin" if self.venv else Path(sys.executable).parent


def _gmlp(bin_dir: Path, ports: Ports, work: Path) -> list[str]:
    return serve_argv(
        work / "repository",
        ports.http,
        *("--variant", "int8", "--instances", str(instances())),
        *("--intra-op-threads", str(intra_op_threads()), "--max-batch-size", "16"),
        *("--max-queue-delay-ms", "2", "--log-level", "warning"),
    )


def _litserve(bin_dir: Path, ports: Ports, work: Path) -> list[str]:
    return [str(bin_dir / "python"), "-m", "benchmarks.peers.litserve_server", "--port", str(ports.http)]


def _ray(bin_dir: Path, ports: Ports, work: Path) -> list[str]:
    """Ray Serve with direct ingress: the measured port is the replica's own, not the proxy's."""
    proxy, grpc = ports.extra
    return [
        *(str(bin_dir / "python"), "-m", "benchmarks.peers.ray_server", "--temp-dir", str(work / "ray")),
        *("--port", str(proxy), "--direct-port", str(ports.http), "--direct-grpc-port", str(grpc)),
    ]


def _bentoml(bin_dir: Path, ports: Ports, work: Path) -> list[str]:
    service = "benchmarks.peers.bentoml_service:Classifier"
    return [str(bin_dir / "bentoml"), "serve", service, "--host", "127.0.0.1", "--port", str(ports.http)]


PEERS: tuple[Peer, ...] = (
    Peer("gmlp-serve", "gmlp-serve", None, (), _gmlp, "raw"),
    Peer("gmlp-serve-multipart", "gmlp-serve (multipart)", None, (), _gmlp, "multipart"),
    Peer("litserve", "LitServe 0.2.19", "litserve", (LITSERVE, MULTIPART), _litserve, "multipart"),
    Peer("ray-direct", "Ray Serve 2.60 (direct ingress)", "ray", (RAY,), _ray, "raw", extra_ports=2),
    Peer(
        *("bentoml", "BentoML 1.4.40 (batchable API)", "bentoml", (BENTOML,), _bentoml, "multipart"),
        env={"BENTOML_DO_NOT_TRACK": "True"},
    ),
)
PEER_KEYS = tuple(p.key for p in PEERS)


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
    """What pip installs into the peer's venv (the repository last, editable, no extras). A shared
    package the peer pins itself (a framework that does not accept the product's version) keeps
    the peer's pin."""
    plain = [p for p in peer.packages if "==" in p]
    unpinned = tuple(p for p in peer.packages if "==" not in p)
    own = {re.split(r"[\[=]", p, maxsplit=1)[0].lower() for p in plain}
    shared = tuple(n for n in SHARED_PINS if n not in own)
    return [*plain, *product_pins(shared + unpinned), "-e", str(REPO)]


def ensure_venv(peer: Peer, log: Callable[[str], None] = print) -> None:
    """Create or update the peer's venv; a marker holding the install spec skips repeat installs."""
    if peer.venv is None:
        return
    spec = install_spec(peer)
    root = VENVS / peer.venv
    marker = root / ".installed"
    if marker.exists() and marker.read_text() == "\n".join(spec):
        return
    log(f"installing {peer.venv} into {root} (once): {' '.join(spec)}")
    if not (root / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *spec], check=True)
    marker.write_text("\n".join(spec))
