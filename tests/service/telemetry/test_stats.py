"""/stats' arithmetic on real Prometheus series: quantiles from histogram buckets, rates and means
between snapshots, and which routes count as served requests."""

from __future__ import annotations

import math
import random

import pytest

from service.telemetry.metrics import LATENCY_BUCKETS, ServiceMetrics
from service.telemetry.recent import StatsHistory, counted, quantile, take_snapshot


def _bucket_of(value: float) -> tuple[float, float]:
    """The (lower, upper] latency bucket holding `value`."""
    lower = 0.0
    for bound in LATENCY_BUCKETS:
        if value <= bound:
            return lower, bound
        lower = bound
    return LATENCY_BUCKETS[-1], float("inf")


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_fall_in_the_bucket_of_the_true_quantile(seed: int) -> None:
    rng = random.Random(seed)
    metrics = ServiceMetrics(8)
    values = sorted(rng.lognormvariate(-4, 1.2) for _ in range(rng.randint(50, 400)))
    for value in values:
        metrics.latency.labels("/classify", "POST", "200").observe(value)
    counts = take_snapshot(metrics).latency
    for q in (0.5, 0.9, 0.99):
        true = values[math.ceil(q * len(values)) - 1]  # the rank the buckets are searched for
        lower, upper = _bucket_of(true)
        estimate = quantile(q, counts)
        assert estimate is not None
        assert lower <= estimate <= min(upper, LATENCY_BUCKETS[-1]), (q, true, estimate)


def test_no_observations_no_quantile() -> None:
    assert quantile(0.5, take_snapshot(ServiceMetrics(8)).latency) is None


def test_the_services_own_traffic_is_not_counted() -> None:
    assert all(
        counted(r) for r in ("/classify", "/fill-mask", "/models", "/v2/models/{name}/infer", "ModelInfer")
    )
    assert not any(
        counted(r) for r in ("/stats", "/metrics", "/health/ready", "/", "/ui", "/ui/vendor", "ServerReady")
    )


def test_report_window_and_series_from_the_metrics() -> None:
    metrics = ServiceMetrics(8)
    history = StatsHistory(metrics, window_s=60, interval_s=1)
    for _ in range(6):
        metrics.latency.labels("/classify", "POST", "200").observe(0.004)
    metrics.latency.labels("/health/ready", "GET", "200").observe(0.001)
    metrics.grpc_latency.labels("ModelInfer", "OK").observe(0.02)
    for size in (4, 2, 1):
        metrics.batch_size.labels("m").observe(size)
    metrics.queue_depth.labels("m", "1").set(3)
    history.snapshots.append(take_snapshot(metrics))
    report = history.report()
    window = report["window"]
    assert report["requests_total"] == window["requests"] == 7  # 6 HTTP + 1 gRPC, not the probe
    assert window["requests_per_s"] == pytest.approx(7 / window["seconds"])
    assert window["batch_size"] == pytest.approx(7 / 3)
    assert window["queue_depth"] == 3
    assert _bucket_of(0.004)[0] <= window["p50_ms"] / 1000 <= _bucket_of(0.004)[1]
    (point,) = report["series"]
    assert point["requests"] == 7 and point["batch_size"] == pytest.approx(7 / 3)


def test_history_keeps_one_window() -> None:
    history = StatsHistory(ServiceMetrics(8), window_s=10, interval_s=2)
    for _ in range(20):
        history.snapshots.append(take_snapshot(history.metrics))
    assert len(history.snapshots) == 6  # five intervals: the whole window
    assert len(history.report()["series"]) == 5
