"""Failures and latency across model-version swaps: /classify p50/p99 at steady state against
during swaps, at the same load, on one `gmlp serve` watching its repository (poll mode).

    python -m benchmarks.swap --model models/cifar10-gmlp --concurrency 8 --steady-s 10 --swaps 3

The model directory is copied into a fresh repository as version 1. Each swap deploys the next
version as a copy (of `--model-v2` when given, else of the model itself: the same weights, but
still a full load beside the serving version, warm-up, recorded check and drain), moved into place
with one rename, and waits until the index shows it READY and its predecessor unloaded. A request
counts as "during a swap" when it started between a deployment and one second after its swap
ended; every other request is steady state. The server holds one key with every scope (the
repository index is an admin route), which every request of the benchmark sends.
"""

from __future__ import annotations

import io
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import command_line, cpu_line, gmlp_serve
from service.access.keys import key_line, new_key

Sample = tuple[float, float, bool]  # start (monotonic), latency s, ok


def _image() -> bytes:
    """A 32x32 PNG of random pixels (the service decodes and transforms it like any upload)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


# The key every request sends (the server's keys file holds its digest).
KEY = new_key()


def _post(url: str, body: bytes, timeout: float = 30.0) -> bytes:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _load(url: str, image: bytes, stop: threading.Event, samples: list[Sample], lock: threading.Lock) -> None:
    for _ in range(1_000_000):  # bounded; `stop` ends it
        if stop.is_set():
            return
        start = time.monotonic()
        try:
            _post(url, image)
            ok = True
        except (urllib.error.URLError, OSError):
            ok = False
        with lock:
            samples.append((start, time.monotonic() - start, ok))


def _versions(base_url: str, name: str) -> dict[str, str]:
    index = json.loads(_post(f"{base_url}/v2/repository/index", b""))
    return {e["version"]: e["state"] for e in index if e["name"] == name}


def _swapped(base_url: str, name: str, expected: dict[str, str]) -> Callable[[], None]:
    """A readiness probe: raises KeyError ("not yet") until the index shows `expected`."""

    def probe() -> None:
        if _versions(base_url, name) != expected:
            raise KeyError("the swap has not finished")

    return probe


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = command_line(__doc__)
    parser.add_argument("--model", type=Path, required=True, help="an exported model directory (version 1)")
    parser.add_argument("--model-v2", type=Path, help="the directory to deploy as each new version")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    parser.add_argument("--steady-s", type=float, default=10.0, help="steady state before, between and after")
    parser.add_argument("--swaps", type=int, default=3, help="versions deployed one after the other")
    parser.add_argument("--poll-s", type=float, default=0.5, help="GMLP_REPOSITORY_POLL_S of the server")
    args = parser.parse_args(argv)
    name = "model"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        shutil.copytree(args.model, repo / name / "1")
        keys = Path(tmp) / "api-keys"
        keys.write_text(key_line("operator", "infer,admin,metrics", KEY) + "\n")
        server = gmlp_serve(
            repo,
            log_path=Path(tmp) / "server.log",
            serve_args=["--model-control", "poll", "--repository-poll-s", str(args.poll_s)]
            + ["--api-keys-file", str(keys)],
        )
        samples: list[Sample] = []
        windows: list[tuple[float, float]] = []
        lock, stop = threading.Lock(), threading.Event()
        with server:
            url = f"{server.base_url}/classify"
            image = _image()
            threads = [
                threading.Thread(target=_load, args=(url, image, stop, samples, lock), daemon=True)
                for _ in range(args.concurrency)
            ]
            for thread in threads:
                thread.start()
            time.sleep(args.steady_s)
            for version in range(2, args.swaps + 2):
                staging = Path(tmp) / f"staging-{version}"
                shutil.copytree(args.model_v2 or args.model, staging)
                began = time.monotonic()
                staging.rename(repo / name / str(version))
                expected = {str(v): "UNAVAILABLE" for v in range(1, version)} | {str(version): "READY"}
                server.wait_ready(_swapped(server.base_url, name, expected), 120)
                windows.append((began, time.monotonic() + 1.0))
                time.sleep(args.steady_s)
            stop.set()
            for thread in threads:
                thread.join(60)
    in_swap = [any(a <= s[0] <= b for a, b in windows) for s in samples]
    during = [s for s, flag in zip(samples, in_swap, strict=True) if flag]
    steady = [s for s, flag in zip(samples, in_swap, strict=True) if not flag]
    print(cpu_line())
    print(
        f"concurrency {args.concurrency}, {args.swaps} swaps, "
        f"swap windows {[round(b - a, 1) for a, b in windows]} s"
    )
    print("| phase | requests | failed | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for label, group in (("steady state", steady), ("during swaps", during)):
        latencies = [s[1] * 1000 for s in group if s[2]]
        failed = sum(1 for s in group if not s[2])
        p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
        print(f"| {label} | {len(group)} | {failed} | {p50:.1f} | {p99:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
