"""Metrics across worker processes: each worker writes its own files (prometheus_client's
multiprocess mode) and any of them reads the whole server back: /metrics, the v2 statistics and
/stats' snapshots. The mode is chosen when prometheus_client is imported, so the workers are real
subprocesses (this file run as a script) and the test process itself never enters it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from gmlp.server_process import gmlp_serve, link_repository
from service.engine.request_context import BatchRun
from service.telemetry.metrics import (
    MULTIPROCESS,
    LifecycleMetrics,
    ModelObserver,
    ServiceMetrics,
    fold_dead_process,
    server_registry,
)
from service.telemetry.recent import take_snapshot
from support.repository_servers import v2_image_request

REPO = Path(__file__).resolve().parents[3]
# What each worker records: batches (size, run seconds, each row's wait), v2 requests by outcome,
# HTTP requests, and its gauges.
WORKERS: list[dict[str, Any]] = [
    {
        "batches": [[4, 0.5, 0.25], [1, 0.125, 0.5]],
        "success": 3,
        "fail": 1,
        "http": 5,
        "in_flight": 1,
        "ready": 1,
        "keys": 2,
        "capacity": 4,
    },
    {
        "batches": [[4, 0.25, 0.125], [2, 1.0, 0.0], [2, 0.5, 0.5]],
        "success": 2,
        "fail": 2,
        "http": 3,
        "in_flight": 2,
        "ready": 0,
        "keys": 3,
        "capacity": 6,
    },
]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def record(metrics: ServiceMetrics, spec: dict[str, Any]) -> None:
    """What one worker serves, recorded the way the server records it."""
    observer, t = ModelObserver(metrics, "m", "1"), 10.0  # t: when each batch starts (monotonic)
    for size, seconds, wait in spec["batches"]:
        observer.batch_done(
            BatchRun(0, [None] * size, [None] * size, [t - wait] * size, t, t, t + seconds, t + seconds)
        )
    for outcome in ("success", "fail"):
        metrics.statistics.requests.labels("m", "1", outcome).inc(spec[outcome])
        metrics.statistics.request_seconds.labels("m", "1", outcome).inc(0.5 * spec[outcome])
    for _ in range(spec["http"]):
        metrics.latency.labels("/classify", "POST", "200").observe(0.004)
    metrics.in_flight.set(spec["in_flight"])
    metrics.model_ready.labels("m").set(spec["ready"])
    metrics.api_keys.set(spec["keys"])
    for version in ("1", "2"):
        metrics.queue_capacity.labels("m", version).set(spec["capacity"])
    LifecycleMetrics(metrics, lambda: None).closed("m", 2)  # a retired version: no capacity left behind


def readout(metrics: ServiceMetrics) -> dict[str, Any]:
    """What the server answers: /metrics, the statistics of m/1 and a /stats snapshot (as JSON)."""
    (counters,) = metrics.statistics.counters([("m", "1")])
    document = {"metrics": metrics.render().decode(), "counters": asdict(counters)}
    return json.loads(json.dumps({**document, "snapshot": asdict(take_snapshot(metrics))}))


def expected_counters(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The statistics of m/1 after `workers` recorded, summed from their inputs."""
    batches = [batch for spec in workers for batch in spec["batches"]]
    sizes: dict[str, dict[str, float]] = {}
    for size, seconds, _ in batches:
        entry = sizes.setdefault(str(size), {"count": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["seconds"] += seconds
    rows = sum(size for size, _, _ in batches)
    outcome = {name: sum(spec[name] for spec in workers) for name in ("success", "fail")}
    return {
        "inferences": rows,
        "executions": len(batches),
        "success": {"count": outcome["success"], "seconds": 0.5 * outcome["success"]},
        "fail": {"count": outcome["fail"], "seconds": 0.5 * outcome["fail"]},
        "queue": {"count": rows, "seconds": sum(size * wait for size, _, wait in batches)},
        "compute": {"count": rows, "seconds": sum(size * seconds for size, seconds, _ in batches)},
        "by_batch_size": dict(sorted(sizes.items(), key=lambda item: int(item[0]))),
    }


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def gauges(samples: Samples) -> dict[str, float | None]:
    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    return {
        "in_flight": value("gmlp_http_requests_in_flight"),
        "ready": value("gmlp_model_ready", model="m"),
        "keys": value("gmlp_api_keys"),
        "capacity": value("gmlp_queue_capacity", model="m", version="1"),
        "retired_capacity": value("gmlp_queue_capacity", model="m", version="2"),
    }


def check_traffic(document: dict[str, Any], workers: list[dict[str, Any]]) -> None:
    """The counters, /metrics and the snapshot count every worker in `workers`."""
    counters = document["counters"]
    expected = expected_counters(workers)
    assert {key: counters[key] for key in expected} == expected
    assert counters["last_inference_s"] > 0
    samples = parse(document["metrics"])
    series = (("model", "m"), ("version", "1"))
    assert samples[("gmlp_model_inferences_total", series)] == expected["inferences"]
    assert samples[("gmlp_batch_size_count", (("model", "m"),))] == expected["executions"]
    snapshot = document["snapshot"]
    assert snapshot["requests"] == sum(spec["http"] for spec in workers)
    assert (snapshot["batches"], snapshot["batched_requests"]) == (
        expected["executions"],
        expected["inferences"],
    )


def worker(directory: Path, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one worker process on `directory`: it records `spec` (nothing: a worker that only
    answers), then reads the server back; its pid and readout."""
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
    }
    command = [sys.executable, __file__, json.dumps(spec or {})]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=True)
    return dict(json.loads(done.stdout))


def test_every_worker_reads_the_whole_server(tmp_path: Path) -> None:
    pids = [worker(tmp_path, spec)["pid"] for spec in WORKERS]
    answer = worker(tmp_path)
    assert answer["multiprocess"]
    check_traffic(answer, WORKERS)
    assert gauges(parse(answer["metrics"])) == {
        "in_flight": sum(spec["in_flight"] for spec in WORKERS),  # livesum
        "ready": min(spec["ready"] for spec in WORKERS),  # livemin
        "keys": max(spec["keys"] for spec in WORKERS),  # livemax
        "capacity": sum(spec["capacity"] for spec in WORKERS),
        "retired_capacity": 0,
    }
    # The supervisor's registry (another process, not in multiprocess mode) exposes the same.
    assert parse(generate_latest(server_registry(str(tmp_path))).decode()) == parse(answer["metrics"])

    mark_process_dead(pids[1], str(tmp_path))  # its live gauges go, its counts stay
    after = worker(tmp_path)
    check_traffic(after, WORKERS)
    assert after["counters"]["last_inference_s"] == answer["counters"]["last_inference_s"]
    survivor = WORKERS[0]
    assert gauges(parse(after["metrics"])) == {
        "in_flight": survivor["in_flight"],
        "ready": survivor["ready"],
        "keys": survivor["keys"],
        "capacity": survivor["capacity"],
        "retired_capacity": 0,
    }


def test_servers_sharing_the_directory_answer_for_all(
    tmp_path: Path, tiny_vision_served: Path, cifar_images: list[bytes]
) -> None:
    """Two `gmlp serve` processes on one directory, as the workers of one server: whichever answers,
    the statistics count what both ran (consecutive reads agree, as perf_analyzer requires)."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    repository = link_repository(tmp_path, tiny_vision_served)
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    servers = [gmlp_serve(repository, log_path=tmp_path / f"{i}.log", env=env) for i in range(2)]
    body, headers = v2_image_request(cifar_images[0])
    sent = [2, 3]
    with servers[0], servers[1]:
        for server, count in zip(servers, sent, strict=True):
            with httpx.Client(base_url=server.base_url, timeout=30) as client:
                for _ in range(count):
                    answer = client.post("/v2/models/tiny-vision/infer", content=body, headers=headers)
                    assert answer.status_code == 200
        stats = [httpx.get(f"{server.base_url}/v2/models/tiny-vision/stats").json() for server in servers]
    assert stats[0] == stats[1]
    (model,) = stats[0]["model_stats"]
    assert model["inference_count"] == model["inference_stats"]["success"]["count"] == sum(sent)


def test_one_process_reads_its_own_registry() -> None:
    assert not MULTIPROCESS
    metrics = ServiceMetrics(8)
    assert metrics.exposed is metrics.registry
    spec = WORKERS[1]
    record(metrics, spec)
    document = readout(metrics)
    check_traffic(document, [spec])
    assert gauges(parse(document["metrics"])) == {
        "in_flight": spec["in_flight"],
        "ready": spec["ready"],
        "keys": spec["keys"],
        "capacity": spec["capacity"],
        "retired_capacity": None,  # removed
    }


if __name__ == "__main__":  # one worker process of the test above
    metrics = ServiceMetrics(8)
    if spec := json.loads(sys.argv[1]):
        record(metrics, spec)
    print(json.dumps({"pid": os.getpid(), "multiprocess": MULTIPROCESS, **readout(metrics)}))


def test_dead_workers_counts_are_folded_into_one_archive_per_kind(tmp_path: Path) -> None:
    """Children that die and are replaced leave a bounded number of files: each dead one's counts
    are folded into one archive per kind, and the server reads what it read before."""
    pids = [worker(tmp_path, spec)["pid"] for spec in WORKERS]
    for pid in pids:
        mark_process_dead(pid, str(tmp_path))
    before = parse(generate_latest(server_registry(str(tmp_path))).decode())
    for pid in pids:
        fold_dead_process(tmp_path, pid)
    assert parse(generate_latest(server_registry(str(tmp_path))).decode()) == before
    left = sorted(f.name for f in tmp_path.glob("*.db"))
    assert left and all(name.endswith("_archive.db") for name in left), left
    assert not list(tmp_path.glob("*.folding"))
    # A live worker's readout still counts every dead one's traffic, from the archives.
    check_traffic(worker(tmp_path), WORKERS)


def test_a_damaged_series_file_is_left_as_it_is(tmp_path: Path) -> None:
    """Folding is housekeeping: a dead process's file it cannot read stays, and nothing raises."""
    damaged = tmp_path / "counter_4242.db"
    store = MmapedDict(str(damaged))
    store.write_value("not the JSON key of a series", 1.0, 0.0)
    store.close()
    written = damaged.read_bytes()
    fold_dead_process(tmp_path, 4242)
    assert damaged.read_bytes() == written
    assert not list(tmp_path.glob("*.folding")) and not list(tmp_path.glob("*_archive.db"))
