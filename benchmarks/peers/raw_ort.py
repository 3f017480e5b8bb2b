"""The floor every server is compared with: session.run at batch 16 on preprocessed images, no HTTP.

Run from as many threads at once as the servers have execution instances (GMLP_PEER_INSTANCES),
each instance's session with its share of the CPUs, as the servers run it.

Run as its own process so that its CPU time (getrusage of the process: ORT's threads included)
is the model's alone. It also times the preprocessing (decode + transform, one image at a time)
so that a server's CPU per request can be read as model + preprocessing + the server's own
overhead. Prints one JSON object:

    python -m benchmarks.peers.raw_ort --model-dir models/cifar10-gmlp --seconds 10
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.peers.model import MAX_BATCH, PeerModel, instances
from loadtests.workload import BUNDLED_DIR


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Runs:
    """What `run_concurrently` did: calls made, wall seconds, CPU seconds of the whole process."""

    calls: int
    wall_s: float
    cpu_s: float


def run_concurrently(run: Callable[[int], object], threads: int, seconds: float) -> Runs:
    """Call `run(k)` (k: the call's number, 0, 1, ... across all threads) from `threads` threads
    for `seconds`. ORT releases the GIL, so the threads run their sessions in parallel, as a
    server's execution instances do."""
    calls = itertools.count()
    cpu0, t0 = _cpu_s(), time.perf_counter()

    def worker() -> None:
        while time.perf_counter() - t0 < seconds:
            run(next(calls))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    # `calls` has handed out one number per call made; the next one is their count.
    return Runs(next(calls), time.perf_counter() - t0, _cpu_s() - cpu0)


def measure(model: PeerModel, images: list[bytes], seconds: float) -> dict[str, float]:
    """images/s and CPU ms per image of session.run at batch 16, from as many threads as the
    servers have execution instances; CPU ms of preprocessing per image."""
    cpu0, t0 = _cpu_s(), time.perf_counter()
    pixels = [model.preprocess(images[i % len(images)]) for i in range(MAX_BATCH * 8)]
    pre_cpu_ms = (_cpu_s() - cpu0) * 1000.0 / len(pixels)
    pre_wall_ms = (time.perf_counter() - t0) * 1000.0 / len(pixels)
    batch = np.stack(pixels[:MAX_BATCH])
    model.logits(batch)  # warm
    runs = run_concurrently(lambda _: model.logits(batch), instances(), seconds)
    return {
        "images_per_s": runs.calls * MAX_BATCH / runs.wall_s,
        "cpu_ms_per_image": runs.cpu_s * 1000.0 / (runs.calls * MAX_BATCH),
        "preprocess_cpu_ms_per_image": pre_cpu_ms,
        "preprocess_wall_ms_per_image": pre_wall_ms,
        "batches": runs.calls,
        "instances": instances(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    model = PeerModel.load(args.model_dir)
    model.warm_up()
    images = [p.read_bytes() for p in sorted(BUNDLED_DIR.glob("cifar10-test-*.jpg"))]
    print(json.dumps(measure(model, images, args.seconds)))


if __name__ == "__main__":
    main()
