"""Prometheus metrics, on a registry owned by the app (several apps in one process must not clash).

`ServiceMetrics` holds every series; the transports record into it (HTTP: the metrics middleware
of `service.http.metrics`, labelled by route template; gRPC: the server's interceptor), and the
batcher reports through the `BatchObserver` interface (`ModelObserver` here), so that the batcher
itself stays free of Prometheus. Nothing here knows a transport.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def power_of_two_buckets(max_batch_size: int) -> tuple[float, ...]:
    """1, 2, 4, ... up to the first power of two >= max_batch_size."""
    buckets, b = [], 1
    while True:
        buckets.append(float(b))
        if b >= max_batch_size:
            return tuple(buckets)
        b *= 2


class ServiceMetrics:
    """All metrics of one app instance."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_batch_size: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gmlp_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gmlp_http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("gmlp_http_requests_in_flight", "HTTP requests being handled", registry=r)
        self.grpc_calls = Counter(
            "gmlp_grpc_calls", "gRPC calls by method and status code", ["method", "code"], registry=r
        )
        self.grpc_latency = Histogram(
            "gmlp_grpc_call_duration_seconds",
            "gRPC call latency by method and status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "gmlp_queue_depth", "requests waiting in the batch queue", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "gmlp_batch_size",
            "requests per executed batch",
            ["model"],
            buckets=power_of_two_buckets(max_batch_size),
            registry=r,
        )
        self.queue_wait = Histogram(
            "gmlp_queue_wait_seconds",
            "time from enqueue to batch start",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "gmlp_inference_seconds", "run time of one batch", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.refusals = Counter(
            "gmlp_refusals",
            "error answers by transport (rest, v2, hf, grpc; http: the connection cap) and machine code "
            "(e.g. invalid_image, payload_too_large, overloaded, timeout)",
            ["transport", "code"],
            registry=r,
        )
        self.rejections = Counter(
            "gmlp_rejections",
            "requests refused or dropped by the batcher (queue_full, deadline, cancelled, shutting_down)",
            ["model", "reason"],
            registry=r,
        )
        self.model_ready = Gauge(
            "gmlp_model_ready", "1 when the model is loaded and warmed up", ["model"], registry=r
        )
        # --- model lifecycle ---
        self.model_versions = Gauge(
            "gmlp_model_versions",
            "model versions known to the service by state (READY, LOADING, UNLOADING, UNAVAILABLE)",
            ["state"],
            registry=r,
        )
        self.version_loads = Counter(
            "gmlp_model_version_loads", "versions loaded, warmed up and checked", ["model"], registry=r
        )
        self.version_unloads = Counter(
            "gmlp_model_version_unloads", "versions drained and closed", ["model"], registry=r
        )
        self.version_refusals = Counter(
            "gmlp_model_version_refusals",
            "loads refused by reason (load_failed: the load, warm-up or check failed; too_many_versions)",
            ["model", "reason"],
            registry=r,
        )
        self.version_requests = Counter(
            "gmlp_model_version_requests",
            "requests answered by a model version (every task API and v2, REST and gRPC)",
            ["model", "version"],
            registry=r,
        )
        for state in ("READY", "LOADING", "UNLOADING", "UNAVAILABLE"):
            self.model_versions.labels(state).set(0)

    def refused(self, transport: str, code: str) -> None:
        """An error answer, by transport and machine code (what was wrong, what was shed)."""
        self.refusals.labels(transport, code).inc()

    def grpc_call(self, method: str, code: str, seconds: float) -> None:
        """A finished gRPC call (the protocol's method name, the status code's name)."""
        self.grpc_calls.labels(method, code).inc()
        self.grpc_latency.labels(method, code).observe(seconds)

    def observer(self, model: str) -> ModelObserver:
        return ModelObserver(self, model)

    def lifecycle(self) -> LifecycleMetrics:
        return LifecycleMetrics(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelObserver:
    """`BatchObserver` for one model."""

    def __init__(self, metrics: ServiceMetrics, model: str) -> None:
        self._depth = metrics.queue_depth.labels(model)
        self._batch = metrics.batch_size.labels(model)
        self._wait = metrics.queue_wait.labels(model)
        self._inference = metrics.inference.labels(model)
        self._rejections = metrics.rejections
        self._model = model
        self._depth.set(0)

    def queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def rejected(self, reason: str) -> None:
        self._rejections.labels(self._model, reason).inc()

    def batch_done(self, size: int, queue_waits: Sequence[float], run_seconds: float) -> None:
        self._batch.observe(size)
        self._inference.observe(run_seconds)
        for wait in queue_waits:
            self._wait.observe(wait)


class LifecycleMetrics:
    """`LifecycleObserver` of the version table (`service.core.versions`)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def state_changed(self, model: str, version: int, old: str | None, new: str | None) -> None:
        if old is not None:
            self._metrics.model_versions.labels(old).dec()
        if new is not None:
            self._metrics.model_versions.labels(new).inc()

    def loaded(self, model: str) -> None:
        self._metrics.version_loads.labels(model).inc()

    def unloaded(self, model: str) -> None:
        self._metrics.version_unloads.labels(model).inc()

    def refused(self, model: str, reason: str) -> None:
        self._metrics.version_refusals.labels(model, reason).inc()

    def leased(self, model: str, version: int) -> None:
        self._metrics.version_requests.labels(model, str(version)).inc()


__all__ = ["ServiceMetrics", "ModelObserver", "LifecycleMetrics", "power_of_two_buckets", "LATENCY_BUCKETS"]
