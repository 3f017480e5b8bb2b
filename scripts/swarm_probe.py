"""Traffic and per-replica counts for the live Swarm test (scripts/swarm-test.sh).

`load`: a small, bounded load through the load balancer. Workers alternate POST /classify (a
CIFAR-10 test JPEG) and POST /fill-mask (a masked sentence), each on its own keep-alive
connection, and check every answer: status 200 and the documented response schema. A request
fails when it gets another status, a malformed body, or no answer (refused, reset, timed out).
It stops at the first of --duration, --max-requests, or the --stop-file appearing, and writes
the totals and the first failures as JSON.

`replicas`: per replica, the POST requests it answered with 200 and the batches it ran (count
and requests in them), read from the replica's own /metrics inside its container (`docker exec`),
so the figures are the replica's, not the balancer's. Counters are cumulative: compare two calls.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from loadtests.engine import classify_request, fill_mask_request, run_closed_loop
from loadtests.runner import sample_totals

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "loadtests" / "data" / "cifar10-test-03000-cat.jpg"
TEXT = "the cat sat on the [MASK]."
TOP_K = 3
KEPT_FAILURES = 50


def run_load(args: argparse.Namespace) -> dict[str, object]:
    """The load's totals, latency percentiles and first failures (closed loop, `--workers` wide)."""
    requests = [classify_request(IMAGE.read_bytes(), TOP_K, multipart=True), fill_mask_request(TEXT, TOP_K)]
    stop_file = Path(args.stop_file) if args.stop_file else None
    start = time.perf_counter()
    result = run_closed_loop(
        args.url,
        requests,
        concurrency=args.workers,
        seconds=args.duration,
        max_requests=args.max_requests,
        timeout_s=args.timeout,
        pause_s=args.pause,
        stop=lambda: stop_file is not None and stop_file.exists(),
    )
    failures = [
        {"t_s": round(o.started - start, 2), "path": o.path, "error": o.error}
        for o in result.outcomes
        if o.error is not None
    ]
    return {
        "requests": len(result.outcomes),
        "ok": result.ok,
        "failed": result.failed,
        "seconds": round(result.seconds, 1),
        "ok_per_s": round(result.rps, 1),
        **{f"p{q}_ms": round(result.percentile_ms(q) or float("nan"), 1) for q in (50, 95, 99)},
        "failures": failures[:KEPT_FAILURES],
    }


def _replica_figure(sample: Any) -> str | None:
    """Which of a replica's figures a /metrics sample adds to (None: none)."""
    if sample.name == "gmlp_http_requests_total":
        return (
            "posts" if (sample.labels.get("method"), sample.labels.get("status")) == ("POST", "200") else None
        )
    return {"gmlp_batch_size_count": "batches", "gmlp_batch_size_sum": "batched_requests"}.get(sample.name)


def replica_counts(containers: list[str]) -> dict[str, dict[str, float]]:
    """Per container: POSTs answered 200 (`posts`), batches run and the requests in them."""
    scrape = (
        "import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8000/metrics', timeout=5).read().decode())"
    )
    counts = {}
    for container in containers:
        text = subprocess.run(
            ["docker", "exec", container, "python", "-c", scrape],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        totals = sample_totals(text, _replica_figure)
        counts[container] = {key: totals[key] for key in ("posts", "batches", "batched_requests")}
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="bounded load through the load balancer")
    load.add_argument("--url", default="http://127.0.0.1:8000")
    load.add_argument("--workers", type=int, default=4)
    load.add_argument("--duration", type=float, default=60.0, help="seconds at most")
    load.add_argument("--max-requests", type=int, default=5000, help="requests at most")
    load.add_argument("--pause", type=float, default=0.02, help="seconds between a worker's requests")
    load.add_argument("--timeout", type=float, default=40.0, help="seconds per request")
    load.add_argument("--stop-file", help="stop as soon as this file exists")
    load.add_argument("--out", required=True, help="JSON summary")
    replicas = sub.add_parser("replicas", help="POSTs answered and batches run by each replica container")
    replicas.add_argument("containers", nargs="+")
    args = parser.parse_args(argv)

    if args.command == "replicas":
        print(json.dumps(replica_counts(args.containers)))
        return
    summary = run_load(args)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(
        f"{summary['requests']} requests in {summary['seconds']} s: {summary['failed']} failed; "
        f"{summary['ok_per_s']}/s, p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms"
    )


if __name__ == "__main__":
    main()
