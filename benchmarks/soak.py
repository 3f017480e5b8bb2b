"""Soak benchmark: minutes of mixed /classify + /fill-mask load at a multiple of the sustainable rate.

1. Ramp (open loop): requests arrive at 25, 50, 100, 150, 200, 300... per second, `--ramp-seconds`
   each, until a step is not answered entirely with 200s (a 503, an error, an arrival not sent) or
   leaves a backlog (its last answers come over a second after its last arrival: the queue grew);
   the last rate before it is the *sustainable rate*. (Closed-loop clients measure the client as much as
   the server: a few of them do not fill the batches, many of them compete for the CPU.)
2. Soak (open loop): requests arrive at `--factor` x that rate (default 2x) for `--minutes`,
   alternating a CIFAR-10 JPEG to /classify and a masked sentence to /fill-mask, whatever the
   server answers; at most `--max-outstanding` requests are open at once (the client's own bound:
   arrivals past it are counted as `client_skipped`, not sent), and an arrival the client is too
   late to send (it shares the CPU with the server) is counted as `client_late`, not sent.
3. Per minute: requests/s sent and answered 200, 503s, other errors (any status but 200 and 503,
   a wrong answer, a reset or timed-out connection), p50/p99 latency of the 200s, and the
   server's RSS and open file descriptors (from /proc/PID, sampled every few seconds).

Goals (printed with the figures): RSS growth after the first minute < 5 %, the per-minute p99 of
accepted requests within 20 % of its median, zero non-503 errors. Everything is bounded: the
duration, the number of requests (`--max-requests`) and each request (`--timeout`).

    .venv/bin/python -m benchmarks.soak --repository models --minutes 10 --out soak.json --server-cpus 0
    .venv/bin/python -m benchmarks.soak --url http://127.0.0.1:8000 --pid PID   # a running server

Without `--url`, it starts `gmlp serve --model-repository REPOSITORY` on a free port itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from benchmarks.harness import command_line, cpu_facts, cpu_line, gmlp_serve
from loadtests.checks import check_classify, check_fill_mask
from loadtests.workload import BUNDLED_DIR

IMAGE = BUNDLED_DIR / "cifar10-test-03000-cat.jpg"
TEXTS = ["the cat sat on the [MASK].", "she opened the [MASK] and looked out.", "it was a [MASK] day."]
TOP_K = 3
RAMP_RATES = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200)
SAMPLE_EVERY_S = 5.0
LATE_S = 0.5  # an arrival the client is this late to send is dropped (counted as `client_late`)
MAX_BACKLOG_S = 1.0  # a ramp step whose last answers come later than this after it is beyond capacity
KEPT_ERRORS = 20


@dataclass
class Bucket:
    """Outcomes of the requests that *started* in one time bucket (a minute of the soak, a ramp step)."""

    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)

    def report(self, seconds: float) -> dict[str, Any]:
        ok = sorted(self.latencies)
        return {
            "sent_per_s": round(self.sent / seconds, 1),
            "ok_per_s": round(self.outcomes["ok"] / seconds, 1),
            "refused_503": self.outcomes["503"],
            "errors": self.outcomes["error"],
            "client_skipped": self.outcomes["skipped"],
            "client_late": self.outcomes["late"],
            "p50_ms": _quantile_ms(ok, 0.50),
            "p99_ms": _quantile_ms(ok, 0.99),
            "rss_mib": round(max(self.rss_kib) / 1024, 1) if self.rss_kib else None,
            "open_fds": max(self.fds) if self.fds else None,
            # The machine's 1-minute load average: other work on the CPUs shows in the latencies.
            "loadavg_1m": max(self.loadavg) if self.loadavg else None,
        }


def _quantile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(1000 * values[min(len(values) - 1, int(q * len(values)))], 1)


def proc_sample(pid: int) -> tuple[int, int]:
    """(VmRSS in KiB, open file descriptors) of process `pid`."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Traffic:
    """The two request kinds, alternating, each checked for the documented answer."""

    def __init__(self) -> None:
        self.image = IMAGE.read_bytes()
        self.errors: list[str] = []

    async def one(self, client: aiohttp.ClientSession, i: int, timeout: float) -> tuple[str, float]:
        """Send request number `i`: ('ok' | '503' | 'error', seconds)."""
        began = time.perf_counter()
        limit = aiohttp.ClientTimeout(total=timeout)
        text = TEXTS[(i // 2) % len(TEXTS)]
        try:
            if i % 2 == 0:
                request = client.post(
                    "/classify",
                    params={"top_k": TOP_K},
                    data=self.image,
                    headers={"content-type": "image/jpeg"},
                    timeout=limit,
                )
            else:
                request = client.post("/fill-mask", json={"text": text, "top_k": TOP_K}, timeout=limit)
            async with request as response:
                payload = await response.read()
            seconds = time.perf_counter() - began
            if response.status == 503:
                return "503", seconds
            if response.status != 200:
                return self._error(f"{response.url.path}: HTTP {response.status}: {payload[:150]!r}")
            body = json.loads(payload)
            problem = check_classify(body, TOP_K) if i % 2 == 0 else check_fill_mask(body, text, TOP_K)
            if problem is not None:
                return self._error(f"wrong answer: {problem}")
            return "ok", seconds
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            return self._error(f"{type(exc).__name__}: {exc}")

    def _error(self, message: str) -> tuple[str, float]:
        if len(self.errors) < KEPT_ERRORS:
            self.errors.append(message)
        return "error", 0.0


def _client(url: str, connections: int) -> aiohttp.ClientSession:
    """aiohttp on uvloop: the client shares the CPUs with the server, so it must be light enough per
    request to offer twice the rate the server sustains. Idle connections are dropped well before
    uvicorn's keep-alive timeout (5 s): reusing one the server is closing at that moment would fail
    a request for the client's reason, not the server's."""
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=2.0)
    return aiohttp.ClientSession(base_url=url, connector=connector)


@dataclass(frozen=True)
class OpenLoop:
    """Arrivals at `rate`/s for `buckets` x `bucket_s` seconds, whatever the server answers."""

    rate: float
    buckets: int
    bucket_s: float
    max_requests: int
    max_outstanding: int
    timeout: float


async def open_loop(
    client: aiohttp.ClientSession, traffic: Traffic, plan: OpenLoop, pid: int | None, label: str = ""
) -> tuple[list[Bucket], float]:
    """Run `plan`; outcomes by the bucket a request *started* in, RSS and fds sampled meanwhile;
    also how long the last requests took to be answered after the last arrival (the backlog)."""
    buckets = [Bucket() for _ in range(plan.buckets)]
    start = time.monotonic()
    end = start + plan.bucket_s * plan.buckets
    open_requests: set[asyncio.Task[None]] = set()

    def bucket_at(t: float) -> int:
        return min(int((t - start) // plan.bucket_s), plan.buckets - 1)

    async def run(i: int, bucket: Bucket) -> None:
        outcome, seconds = await traffic.one(client, i, plan.timeout)
        bucket.outcomes[outcome] += 1
        if outcome == "ok":
            bucket.latencies.append(seconds)

    async def sample() -> None:
        while pid is not None and time.monotonic() < end:
            rss, fds = proc_sample(pid)
            bucket = buckets[bucket_at(time.monotonic())]
            bucket.rss_kib.append(rss)
            bucket.fds.append(fds)
            bucket.loadavg.append(os.getloadavg()[0])
            await asyncio.sleep(SAMPLE_EVERY_S)

    sampler = asyncio.create_task(sample())
    reported = -1  # the last bucket printed (while running, for a long soak)
    for i in range(min(plan.max_requests, int(plan.rate * (end - start)))):
        due = start + i / plan.rate
        # Always yield (sleep 0 when behind), so that open requests progress while catching up.
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        index = bucket_at(due)
        if label and index > reported + 1:
            reported = index - 1
            print(f"{label} {reported}: {json.dumps(buckets[reported].report(plan.bucket_s))}", flush=True)
        bucket = buckets[index]
        # An arrival the client could not send on time (it shares the CPU) or beyond its bound of
        # open requests is not sent: what is sent is the load the server really saw.
        if time.monotonic() - due > LATE_S:
            bucket.outcomes["late"] += 1
            continue
        if len(open_requests) >= plan.max_outstanding:
            bucket.outcomes["skipped"] += 1
            continue
        bucket.sent += 1
        task = asyncio.create_task(run(i, bucket))
        open_requests.add(task)
        task.add_done_callback(open_requests.discard)
    arrivals_ended = time.monotonic()
    await asyncio.gather(*open_requests)
    drain_s = time.monotonic() - arrivals_ended
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    return buckets, drain_s


async def ramp(
    client: aiohttp.ClientSession, traffic: Traffic, args: argparse.Namespace
) -> tuple[float, list[dict[str, Any]]]:
    """Open-loop steps at rising rates until one is not fully answered with 200s; the last rate
    that was is the sustainable rate."""
    sustainable, steps = 0.0, []
    for rate in RAMP_RATES:
        plan = OpenLoop(rate, 1, args.ramp_seconds, args.max_requests, args.max_outstanding, args.timeout)
        (step,), drain_s = await open_loop(client, traffic, plan, None)
        report = {"rate_per_s": rate, **step.report(args.ramp_seconds), "backlog_s": round(drain_s, 2)}
        steps.append(report)
        print(f"ramp: {json.dumps(report)}", flush=True)
        # Sustained: every arrival sent and answered 200, and no queue left behind (a queue that
        # grows during the step takes seconds to drain after it).
        if step.outcomes["ok"] < rate * args.ramp_seconds or drain_s > MAX_BACKLOG_S:
            break
        sustainable = rate
    return sustainable, steps


def summarise(
    minutes: list[Bucket], rate: float, ramp_steps: list[dict[str, Any]], errors: list[str]
) -> dict[str, Any]:
    per_minute = [m.report(60.0) for m in minutes]
    later = per_minute[1:] or per_minute
    rss = [m["rss_mib"] for m in later if m["rss_mib"] is not None]
    p99 = [m["p99_ms"] for m in later if m["p99_ms"] is not None]
    rss_growth = (rss[-1] - rss[0]) / rss[0] if len(rss) > 1 else None
    p99_median = statistics.median(p99) if p99 else None
    p99_spread = max(abs(p - p99_median) / p99_median for p in p99) if p99_median else None
    errors_total = sum(m.outcomes["error"] for m in minutes)
    return {
        "sustainable_ok_per_s": rate,
        "ramp": ramp_steps,
        "minutes": per_minute,
        "rss_growth_after_first_minute": None if rss_growth is None else round(rss_growth, 4),
        "p99_max_deviation_from_median": None if p99_spread is None else round(p99_spread, 3),
        "non_503_errors": errors_total,
        "first_errors": errors,
        "goals": {
            "rss_growth_below_5_percent": rss_growth is not None and rss_growth < 0.05,
            "p99_within_20_percent": p99_spread is not None and p99_spread <= 0.20,
            "zero_non_503_errors": errors_total == 0,
        },
    }


async def main_async(args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    traffic = Traffic()
    async with _client(args.url, args.max_outstanding) as client:
        sustainable, steps = await ramp(client, traffic, args)
        if sustainable == 0:
            raise SystemExit(f"not even {RAMP_RATES[0]} requests/s were answered: {steps[0]}")
        rate = args.factor * sustainable
        print(
            f"sustainable {sustainable:.0f}/s; soak at {rate:.0f} requests/s for {args.minutes} min",
            flush=True,
        )
        plan = OpenLoop(rate, args.minutes, 60.0, args.max_requests, args.max_outstanding, args.timeout)
        minutes, _ = await open_loop(client, traffic, plan, pid, label="minute")
    return {"url": args.url, "factor": args.factor, "soak_rate_per_s": round(rate, 1)} | summarise(
        minutes, sustainable, steps, traffic.errors
    )


def _cpus(text: str) -> set[int]:
    return {int(cpu) for cpu in text.split(",") if cpu.strip()}


def main(argv: list[str] | None = None) -> int:
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
        type=_cpus,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
