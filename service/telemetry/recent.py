"""Recent traffic at a glance: periodic snapshots of the service's own Prometheus counters.

`StatsHistory` samples the series that /metrics exposes (requests and their latency histograms,
queue depths, batch sizes) every `interval_s` and keeps the last `window_s` of snapshots. Rates,
quantiles and means are differences between two snapshots, computed as Prometheus' `rate()` and
`histogram_quantile()` would from the same series, so /stats and a dashboard agree, and a page can
show them without a Prometheus. The service's own traffic (probes, scrapes, the playground's page
and its polling of the stats) is left out of the request figures: it would otherwise dominate an
idle server's rate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from service.telemetry.metrics import LATENCY_BUCKETS, ServiceMetrics
from service.telemetry.statistics import read

# Route templates and gRPC methods that are the service's own traffic, not requests for a model.
OWN_TRAFFIC = frozenset(
    {
        "/",
        "/stats",
        "/metrics",
        "/favicon.ico",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/health/live",
        "/health/ready",
        "/v2/health/live",
        "/v2/health/ready",
        "<unmatched>",
        "ServerLive",
        "ServerReady",
    }
)
OWN_TRAFFIC_PREFIX = "/ui"  # the playground's assets and the API docs' scripts


def counted(route: str) -> bool:
    """Whether requests to this route template (or gRPC method) count as served requests."""
    return route not in OWN_TRAFFIC and not route.startswith(OWN_TRAFFIC_PREFIX)


@dataclass(frozen=True)
class Snapshot:
    """The cumulative figures at one moment (`at`: monotonic seconds, `wall`: Unix time)."""

    at: float
    wall: float
    requests: float
    # Cumulative request counts at or under each latency bound of LATENCY_BUCKETS, then +Inf.
    latency: tuple[float, ...]
    batches: float
    batched_requests: float
    queue_depth: float


def take_snapshot(metrics: ServiceMetrics) -> Snapshot:
    """Read the served-request and batcher series of `metrics` as /metrics exposes them now."""
    now = read(metrics.merged)
    bounds = [*LATENCY_BUCKETS, float("inf")]
    latency = [0.0] * len(bounds)
    requests = 0.0
    for metric, label in ((metrics.latency, "route"), (metrics.grpc_latency, "method")):
        for name, labels, value, *_ in now(metric):
            if not counted(labels[label]):
                continue
            if name.endswith("_bucket"):
                latency[bounds.index(float(labels["le"]))] += value
            elif name.endswith("_count"):
                requests += value
    batches = batched = 0.0
    for name, _, value, *_ in now(metrics.batch_size):
        if name.endswith("_count"):
            batches += value
        elif name.endswith("_sum"):
            batched += value
    depth = sum(sample.value for sample in now(metrics.queue_depth))
    return Snapshot(time.monotonic(), time.time(), requests, tuple(latency), batches, batched, depth)


def quantile(q: float, counts: tuple[float, ...]) -> float | None:
    """The q-quantile (seconds) of cumulative bucket counts over LATENCY_BUCKETS and +Inf, linearly
    interpolated inside its bucket as `histogram_quantile` does; None without observations. A rank
    in the +Inf bucket answers the highest finite bound (the most the buckets can tell)."""
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(LATENCY_BUCKETS, counts, strict=False):
        if count >= rank:
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return LATENCY_BUCKETS[-1]


def between(old: Snapshot, new: Snapshot) -> dict[str, Any]:
    """Request rate, p50/p99 latency (ms) and mean batch size from `old` to `new`, and the queue
    depth at `new`. Counters only grow, so a negative difference cannot occur within one app."""
    seconds = max(new.at - old.at, 1e-9)
    counts = tuple(b - a for a, b in zip(old.latency, new.latency, strict=True))
    p50, p99 = quantile(0.5, counts), quantile(0.99, counts)
    batches = new.batches - old.batches
    return {
        "requests": new.requests - old.requests,
        "requests_per_s": (new.requests - old.requests) / seconds,
        "p50_ms": None if p50 is None else p50 * 1000.0,
        "p99_ms": None if p99 is None else p99 * 1000.0,
        "queue_depth": new.queue_depth,
        "batch_size": (new.batched_requests - old.batched_requests) / batches if batches else None,
    }


class StatsHistory:
    """The snapshots of the last `window_s` seconds, one every `interval_s` (`run` takes them)."""

    def __init__(self, metrics: ServiceMetrics, window_s: float, interval_s: float) -> None:
        self.metrics = metrics
        self.window_s = window_s
        self.interval_s = interval_s
        # One more than the window holds, so that the oldest difference spans the whole window.
        self.snapshots: deque[Snapshot] = deque(maxlen=max(2, int(window_s / interval_s) + 1))
        self.snapshots.append(take_snapshot(metrics))

    async def run(self) -> None:
        """Take a snapshot every `interval_s`, until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.snapshots.append(take_snapshot(self.metrics))

    def report(self) -> dict[str, Any]:
        """The running totals, the window up to this instant (`window`), and one point per interval
        (`series`, oldest first, each stamped with the Unix time at its end)."""
        now = take_snapshot(self.metrics)
        history = list(self.snapshots)
        # Whole intervals only: a point from the last snapshot to this instant could span a moment.
        points = [{"t": new.wall, **between(old, new)} for old, new in itertools.pairwise(history)]
        oldest = history[0]
        return {
            "requests_total": now.requests,
            "batches_total": now.batches,
            "window": {"seconds": now.at - oldest.at, **between(oldest, now)},
            "interval_s": self.interval_s,
            "series": points,
        }
