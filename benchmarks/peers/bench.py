"""The measurement loop: rounds over every peer, each row a wrk run with the server's CPU around it.

On a small shared machine the background load drifts by tens of percent within minutes, so the
peers are interleaved: each round starts, checks and measures every peer at every concurrency
(the order rotating from round to round), and the report takes medians over rounds. A peer's
answers are checked against raw ONNX Runtime's before any timing: a fast wrong server is no result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import wrk
from benchmarks.harness import REPO
from benchmarks.peers.model import VARIANT, PeerModel, instances, intra_op_threads
from benchmarks.peers.peers import Peer
from benchmarks.peers.server import classify, request_body, running
from gmlp.proc import machine_busy_seconds, reaped_children_cpu_seconds, tree_cpu_seconds
from gmlp.server_process import ServerProcess
from loadtests.workload import BUNDLED_DIR


@dataclass(frozen=True)
class Row:
    """One wrk run against one peer."""

    peer: str
    round: int
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float
    requests: int
    errors: int
    # CPU the rest of the machine used during the row (not the server, not wrk), as a share of
    # all CPUs: the background load that makes a row slow for reasons outside the server.
    others_cpu_pct: float = float("nan")


@dataclass
class Plan:
    """What one benchmark run measures."""

    peers: list[Peer]
    levels: list[int]
    rounds: int
    duration_s: float
    bare_seconds: float
    warmup_s: float = 2.0


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    # The bare /classify pipeline (benchmarks.bare_pipeline) and raw `session.run` beside it
    # (its "raw"), one run per round.
    bare: list[dict[str, Any]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    reference: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) for r in self.rows],
            "bare": self.bare,
            "failed": self.failed,
        }


def test_images() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(BUNDLED_DIR.glob("cifar10-test-*.jpg"))}


def reference_labels(model_dir: Path, images: dict[str, bytes]) -> dict[str, str]:
    """Top labels from raw ONNX Runtime with the product's preprocessing: the answers to match."""
    model = PeerModel.load(model_dir)
    return {
        name: model.predict([model.preprocess(data)])[0]["predictions"][0]["label"]
        for name, data in images.items()
    }


def check_answers(url: str, peer: Peer, images: dict[str, bytes], reference: dict[str, str]) -> None:
    wrong = {
        name: (got, reference[name])
        for name, data in images.items()
        if (got := classify(url, data, peer.body)) != reference[name]
    }
    if wrong:
        raise AssertionError(f"{peer.key} answers differ from raw ORT (got, expected): {wrong}")


def measure_row(server: ServerProcess, peer: str, script: Path, rnd: int, c: int, seconds: float) -> Row:
    before, busy0, wrk0, t0 = (
        tree_cpu_seconds(server.pid),
        machine_busy_seconds(),
        reaped_children_cpu_seconds(),
        time.monotonic(),
    )
    result = wrk.run(server.url, script, c, seconds)
    cpu_s = tree_cpu_seconds(server.pid) - before
    # wrk is the only child that finishes (and is reaped) during the row.
    others = machine_busy_seconds() - busy0 - cpu_s - (reaped_children_cpu_seconds() - wrk0)
    capacity = (time.monotonic() - t0) * (os.cpu_count() or 1)
    return Row(
        peer=peer,
        round=rnd,
        concurrency=c,
        rps=result.rps,
        p50_ms=result.p50_ms,
        p99_ms=result.percentiles_ms.get(99.0, float("nan")),
        cpu_ms_per_request=cpu_s * 1000.0 / max(result.requests, 1),
        requests=result.requests,
        errors=result.errors,
        others_cpu_pct=100.0 * max(others, 0.0) / capacity,
    )


def write_script(work: Path, key: str, image: bytes, kind: str) -> Path:
    body, content_type = request_body(image, kind)
    body_file = work / f"{key}.body"
    body_file.write_bytes(body)
    script = work / f"{key}.lua"
    script.write_text(wrk.lua_script(body_file, content_type))
    return script


def bare_pipeline(model_dir: Path, seconds: float) -> dict[str, Any]:
    """One round of the bare /classify pipeline with the peers' settings (instances, threads,
    variant), in its own process so that its CPU is its own."""
    cmd = [
        *(sys.executable, "-m", "benchmarks.bare_pipeline", "--task", "classify"),
        *("--model-dir", str(model_dir), "--seconds", str(seconds), "--rounds", "1", "--variant", VARIANT),
        *("--instances", str(instances()), "--intra-op-threads", str(intra_op_threads())),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bare pipeline run failed: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_peer(
    peer: Peer,
    rnd: int,
    plan: Plan,
    work: Path,
    model_dir: Path,
    results: Results,
    log: Callable[[str], None],
) -> None:
    images = test_images()
    first = next(iter(images.values()))
    with running(peer, work, model_dir, first) as server:
        check_answers(server.url, peer, images, results.reference)
        script = write_script(work, peer.key, first, peer.body)
        wrk.run(server.url, script, 8, plan.warmup_s)  # warm-up, not recorded
        for c in plan.levels:
            row = measure_row(server, peer.key, script, rnd, c, plan.duration_s)
            results.rows.append(row)
            log(
                f"  {peer.key:22s} c={c:<3d} {row.rps:8.1f} req/s  p50 {row.p50_ms:7.2f} ms"
                f"  CPU {row.cpu_ms_per_request:6.2f} ms/req  errors {row.errors}"
                f"  others {row.others_cpu_pct:3.0f}%"
            )


def run_rounds(plan: Plan, work: Path, model_dir: Path, log: Callable[[str], None] = print) -> Results:
    """Every round: the bare pipeline and raw ORT, then each peer (rotated order) at every level."""
    results = Results()
    results.reference = reference_labels(model_dir, test_images())
    for rnd in range(plan.rounds):
        log(f"round {rnd + 1}/{plan.rounds}")
        bare = bare_pipeline(model_dir, plan.bare_seconds)
        results.bare.append({"round": rnd, **bare["bare"], "raw": bare["raw"]})
        for kind in ("bare", "raw"):
            log(
                f"  {kind} b16: {bare[kind]['requests_per_s']:.1f} images/s,"
                f" {bare[kind]['cpu_ms_per_request']:.2f} CPU ms/image"
            )
        order = plan.peers[rnd % len(plan.peers) :] + plan.peers[: rnd % len(plan.peers)]
        for peer in order:
            if peer.key in results.failed:
                continue
            try:
                run_peer(peer, rnd, plan, work, model_dir, results, log)
            except Exception as exc:  # one broken peer must not lose the others' rows
                results.failed[peer.key] = f"{type(exc).__name__}: {exc}"
                log(f"  {peer.key} FAILED: {results.failed[peer.key]}")
    return results
