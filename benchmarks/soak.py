"""Soak benchmark: minutes of mixed /classify + /fill-mask load at a multiple of the sustainable rate.

    .venv/bin/python -m benchmarks.soak --repository models --minutes 10 --out soak.json --server-cpus 0
    .venv/bin/python -m benchmarks.soak --url http://127.0.0.1:8000 --pid PID   # a running server

An open-loop ramp (25, 50, 100... requests/s, `--ramp-seconds` each) finds the sustainable rate:
the last step answered entirely with 200s that left no backlog (closed-loop clients would measure
the client as much as the server). Then `--factor` x that rate for `--minutes`, open loop,
alternating a JPEG to /classify and a masked sentence to /fill-mask. Per minute: rates, 503s,
other errors, p50/p99 of the 200s, the server's RSS and open fds, against the goals of
docs/reliability.md, "Soak". Without `--url` it starts `gmlp serve` itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psutil
import uvloop

from benchmarks.harness import command_line, cpu_facts, cpu_line
from gmlp.server_process import gmlp_serve
from loadtests import engine
from loadtests.workload import BUNDLED_DIR

IMAGE = BUNDLED_DIR / "cifar10-test-03000-cat.jpg"
TEXTS = ["the cat sat on the [MASK].", "she opened the [MASK] and looked out.", "it was a [MASK] day."]
TOP_K = 3
RAMP_RATES = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200)
SAMPLE_EVERY_S = 5.0
MAX_BACKLOG_S = 1.0  # a ramp step whose last answers come later than this after it is beyond capacity
KEPT_ERRORS = 20
# When (perf_counter), and the server's RSS in KiB, its open fds and the machine's load average.
Sample = tuple[float, tuple[int, int, float]]


def traffic() -> list[engine.PreparedRequest]:
    """The two request kinds, alternating: a JPEG to /classify, a masked sentence to /fill-mask."""
    image = IMAGE.read_bytes()
    requests = []
    for text in TEXTS:
        requests += [engine.classify_request(image, TOP_K), engine.fill_mask_request(text, TOP_K)]
    return requests


def report(
    outcomes: list[engine.Outcome], seconds: float, samples: list[tuple[int, int, float]]
) -> dict[str, Any]:
    """A minute's (or a ramp step's) figures: rates, refusals, errors, latency, RSS, fds, load."""
    ok = [1000 * o.seconds for o in outcomes if o.error is None]
    refused = sum(1 for o in outcomes if o.status == 503)
    return {
        "sent_per_s": round(len(outcomes) / seconds, 1),
        "ok_per_s": round(len(ok) / seconds, 1),
        "refused_503": refused,
        "errors": len(outcomes) - len(ok) - refused,
        "p50_ms": engine.percentile(ok, 50, 1),
        "p99_ms": engine.percentile(ok, 99, 1),
        "rss_mib": round(max(s[0] for s in samples) / 1024, 1) if samples else None,
        "open_fds": max(s[1] for s in samples) if samples else None,
        # The machine's 1-minute load average: other work on the CPUs shows in the latencies.
        "loadavg_1m": max(s[2] for s in samples) if samples else None,
    }


async def ramp(args: argparse.Namespace) -> tuple[float, list[dict[str, Any]]]:
    """Open-loop steps at rising rates until one is not fully answered with 200s or leaves a
    backlog; the last rate that was is the sustainable rate."""
    sustainable, steps = 0.0, []
    for rate in RAMP_RATES:
        step = await _open_loop(args, rate, args.ramp_seconds)
        entry = {"rate_per_s": rate, **report(step.outcomes, args.ramp_seconds, [])}
        entry |= {
            "client_skipped": step.skipped,
            "client_late": step.late,
            "backlog_s": round(step.drain_s, 2),
        }
        steps.append(entry)
        print(f"ramp: {json.dumps(entry)}", flush=True)
        # Sustained: every arrival sent and answered 200, and no queue left behind (a queue that
        # grows during the step takes seconds to drain after it).
        if step.ok < rate * args.ramp_seconds or step.drain_s > MAX_BACKLOG_S:
            break
        sustainable = rate
    return sustainable, steps


def _open_loop(
    args: argparse.Namespace, rate: float, seconds: float
) -> Coroutine[Any, Any, engine.LoadResult]:
    limits = {"max_requests": args.max_requests, "max_outstanding": args.max_outstanding}
    return engine.open_loop(args.url, traffic(), rate=rate, seconds=seconds, timeout_s=args.timeout, **limits)


async def sample(pid: int | None, until: float, into: list[Sample]) -> None:
    """The server's RSS in KiB and open fds, and the machine's load average, every few seconds until
    `until` (perf_counter)."""
    while pid is not None and time.perf_counter() < until:
        process = psutil.Process(pid)
        into.append(
            (time.perf_counter(), (process.memory_info().rss // 1024, process.num_fds(), os.getloadavg()[0]))
        )
        await asyncio.sleep(SAMPLE_EVERY_S)


def summarise(
    soak: engine.LoadResult, start: float, rate: float, steps: list[dict[str, Any]], samples: list[Sample]
) -> dict[str, Any]:
    """Per minute (by the minute a request started in), the goals and the first errors."""
    minutes = max(1, round(soak.seconds / 60))

    def minute(t: float) -> int:
        return min(int((t - start) // 60), minutes - 1)

    per_minute = [
        report(
            [o for o in soak.outcomes if minute(o.started) == m],
            60.0,
            [s for t, s in samples if minute(t) == m],
        )
        for m in range(minutes)
    ]
    later = per_minute[1:] or per_minute
    rss = [m["rss_mib"] for m in later if m["rss_mib"] is not None]
    p99 = [m["p99_ms"] for m in later if m["p99_ms"] is not None]
    rss_growth = (rss[-1] - rss[0]) / rss[0] if len(rss) > 1 else None
    p99_median = statistics.median(p99) if p99 else None
    p99_spread = max(abs(p - p99_median) / p99_median for p in p99) if p99_median else None
    errors = [f"{o.path}: {o.error}" for o in soak.outcomes if o.error is not None and o.status != 503]
    return {
        "sustainable_ok_per_s": rate,
        "ramp": steps,
        "minutes": per_minute,
        "client_skipped": soak.skipped,
        "client_late": soak.late,
        "rss_growth_after_first_minute": None if rss_growth is None else round(rss_growth, 4),
        "p99_max_deviation_from_median": None if p99_spread is None else round(p99_spread, 3),
        "non_503_errors": len(errors),
        "first_errors": errors[:KEPT_ERRORS],
        "goals": {
            "rss_growth_below_5_percent": rss_growth is not None and rss_growth < 0.05,
            "p99_within_20_percent": p99_spread is not None and p99_spread <= 0.20,
            "zero_non_503_errors": not errors,
        },
    }


async def main_async(args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    sustainable, steps = await ramp(args)
    if sustainable == 0:
        raise SystemExit(f"not even {RAMP_RATES[0]} requests/s were answered: {steps[0]}")
    rate = args.factor * sustainable
    print(
        f"sustainable {sustainable:.0f}/s; soak at {rate:.0f} requests/s for {args.minutes} min", flush=True
    )
    samples: list[Sample] = []
    start = time.perf_counter()
    soak, _ = await asyncio.gather(
        _open_loop(args, rate, 60.0 * args.minutes), sample(pid, start + 60.0 * args.minutes, samples)
    )
    summary = summarise(soak, start, sustainable, steps, samples)
    return {"url": args.url, "factor": args.factor, "soak_rate_per_s": round(rate, 1)} | summary


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--url", help="a running server (default: start gmlp serve on --repository)")
    parser.add_argument("--pid", type=int, help="that server's process id, for RSS and open fds")
    parser.add_argument("--repository", type=Path, default=Path("models"))
    parser.add_argument("--serve-arg", action="append", default=[], help="extra gmlp serve flag (repeat)")
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--ramp-seconds", type=float, default=10.0, help="seconds per ramp step")
    parser.add_argument("--factor", type=float, default=2.0, help="soak rate / sustainable rate")
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--max-outstanding", type=int, default=1024, help="open requests at most")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    parser.add_argument(
        "--server-cpus",
        type=lambda text: {int(cpu) for cpu in text.split(",") if cpu.strip()},
        help="CPUs for the server it starts, e.g. 0 (the client takes the others): on a small "
        "machine, so that the client can offer twice what the server sustains",
    )
    args = parser.parse_args(argv)

    server = None
    if args.url is None:
        server = gmlp_serve(
            args.repository,
            log_path=args.out.with_suffix(".server.log"),
            serve_args=args.serve_arg,
            ready_timeout_s=300,
        )
        everything = os.sched_getaffinity(0)
        if args.server_cpus:  # the server inherits the affinity it is started with
            os.sched_setaffinity(0, args.server_cpus)
        server.start()
        if args.server_cpus:
            os.sched_setaffinity(0, (everything - args.server_cpus) or everything)
        args.url, args.pid = server.url, server.pid
    facts = cpu_facts()
    print(cpu_line(facts), flush=True)
    try:
        if server is not None:
            server.wait_ready(server.health)
        result = uvloop.run(main_async(args, args.pid))
    finally:
        if server is not None:
            server.stop()
    args.out.write_text(json.dumps({"machine": facts, **result}, indent=2))
    for i, m in enumerate(result["minutes"]):
        print(f"minute {i}: {json.dumps(m)}")
    print(
        f"RSS growth after minute 0: {result['rss_growth_after_first_minute']}; p99 max deviation "
        f"from median: {result['p99_max_deviation_from_median']}; non-503 errors: {result['non_503_errors']}"
    )
    print("goals:", json.dumps(result["goals"]))


if __name__ == "__main__":
    main()
