"""Prometheus metrics, on a registry owned by the app (several apps in one process must not clash).

`ServiceMetrics` holds every series; the transports record into it (HTTP: the metrics middleware
of `service.http.observe`, labelled by route template; gRPC: the wrapper of every call), and the
batcher reports to its `BatchObserver`s (`ModelObserver` here), so that the batcher itself stays
free of Prometheus. Nothing here knows a transport.

With several worker processes (prometheus_client's multiprocess mode: `PROMETHEUS_MULTIPROC_DIR`
set before it is imported), each worker writes its own files and everything read back (/metrics,
the v2 statistics, /stats) is the merge of all workers' files (`server_registry`), so that any
worker answers for the whole server; each gauge says how its workers' values merge.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from service.engine.batcher import BatchObserver
from service.engine.request_context import BatchRun
from service.telemetry.statistics import StatisticsSeries

log = logging.getLogger(__name__)

MV = ["model", "version"]
ROUTE, CALL = ["route", "method", "status"], ["method", "code"]
QUALITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# Whether prometheus_client keeps its values in per-process files (decided when it was imported).
MULTIPROCESS = bool(getattr(values.ValueClass, "_multiprocess", False))


def server_registry(path: str | None = None) -> CollectorRegistry:
    """The whole server's series: every worker's files in `path` (default PROMETHEUS_MULTIPROC_DIR)
    merged; a dead worker's counters and histograms still count, its live* gauges do not once
    `prometheus_client.multiprocess.mark_process_dead` removed them."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path)
    return registry


# The kinds of series files a dead process leaves whose values still count: they are folded into
# one archive file per kind (`fold_dead_process`). Live gauges' files go with their process.
FOLDED_KINDS = ("counter", "histogram", "summary", "gauge_min", "gauge_max", "gauge_sum")


def fold_dead_process(folder: Path, pid: int) -> None:
    """Fold the series files of dead process `pid` into `folder`'s archive files, one per kind, so
    that a server whose children die and are replaced again and again keeps a bounded number of
    files (each at least a page, each read at every scrape) while every count still counts. Best
    effort: a file it cannot fold (damaged, or its folder removed) is left as it is and logged, and
    the supervisor that calls it goes on."""
    for kind in FOLDED_KINDS:
        dead = folder / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        archive = folder / f"{kind}_archive.db"
        sources = [str(dead), *([str(archive)] if archive.exists() else [])]
        fresh = folder / f"{kind}_archive.folding"  # not *.db: no scrape reads it half-written
        try:
            fresh.unlink(missing_ok=True)  # what a fold cut short left: started anew
            store = MmapedDict(str(fresh))
            try:
                for metric in MultiProcessCollector.merge(sources, accumulate=False):
                    for sample in metric.samples:
                        key = [metric.name, sample.name, sample.labels, metric.documentation]
                        store.write_value(json.dumps(key, sort_keys=True), sample.value, 0.0)
            finally:
                store.close()
            os.replace(fresh, archive)
            dead.unlink()
        except Exception as exc:  # housekeeping: it must not end the supervisor
            log.warning("series file %s not folded into %s, left as it is: %r", dead, archive.name, exc)
            with suppress(OSError):
                fresh.unlink(missing_ok=True)


class ServiceMetrics:
    """All metrics of one app instance."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_batch_size: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Every worker's series merged (several workers), or None: this app's registry is the server's.
        self.merged = server_registry() if MULTIPROCESS else None
        # What /metrics renders and the statistics and /stats read.
        self.exposed = self.registry if self.merged is None else self.merged
        counter = partial(Counter, registry=self.registry)
        # Gauges by how live workers' values merge (multiprocess mode; one process: its value): `summed`
        # what each worker holds, `alike` what every worker holds the same (the largest is shown),
        # `least` readiness (ready when every worker is).
        summed = partial(Gauge, registry=self.registry, multiprocess_mode="livesum")
        alike = partial(Gauge, registry=self.registry, multiprocess_mode="livemax")
        least = partial(Gauge, registry=self.registry, multiprocess_mode="livemin")
        histogram = partial(Histogram, registry=self.registry)
        timing = partial(Histogram, registry=self.registry, buckets=LATENCY_BUCKETS)
        self.requests = counter("gmlp_http_requests", "HTTP requests by route, method and status", ROUTE)
        self.log_lines_suppressed = counter(
            "gmlp_log_lines_suppressed", "client-caused log lines held back over the log's rate limit"
        )
        self.latency = timing(
            "gmlp_http_request_duration_seconds", "HTTP request latency by route, method and status", ROUTE
        )
        self.in_flight = summed("gmlp_http_requests_in_flight", "HTTP requests being handled")
        self.grpc_calls = counter("gmlp_grpc_calls", "gRPC calls by method and status code", CALL)
        self.grpc_latency = timing(
            "gmlp_grpc_call_duration_seconds", "gRPC call latency by method and status code", CALL
        )
        # The three gauges of a version's batcher are labelled by version: two versions are loaded
        # at once during a swap (and with latest:N, all), and each has its own queue and sessions.
        self.queue_depth = summed(
            "gmlp_queue_depth", "requests waiting in the batch queue of a model version", MV
        )
        # 1, 2, 4, ... up to the first power of two >= max_batch_size.
        sizes = [2**i for i in range((max_batch_size - 1).bit_length() + 1)]
        self.batch_size = histogram(
            "gmlp_batch_size", "requests per executed batch", ["model"], buckets=sizes
        )
        self.queue_wait = timing("gmlp_queue_wait_seconds", "time from enqueue to batch start", ["model"])
        self.inference = timing("gmlp_inference_seconds", "run time of one batch", ["model"])
        self.refusals = counter(
            "gmlp_refusals",
            "error answers by transport (rest, v2, hf, grpc; http: the connection cap) and machine code "
            "(e.g. invalid_image, payload_too_large, overloaded, timeout)",
            ["transport", "code"],
        )
        self.connections_closed = counter(
            "gmlp_connections_closed",
            "connections the server closed to keep its connection caps (http, grpc) by reason "
            "(idle_evicted: an idle keep-alive connection closed to make room for a newcomer)",
            ["transport", "reason"],
        )
        self.rejections = counter(
            "gmlp_rejections",
            "requests refused or dropped by the batcher (queue_full, deadline, cancelled, shutting_down)",
            ["model", "reason"],
        )
        self.model_ready = least("gmlp_model_ready", "1 when the model is loaded and warmed up", ["model"])
        # --- per-model statistics (what the v2 statistics extension reports) ---
        self.statistics = StatisticsSeries(self.registry, self.merged)
        # --- access control ---
        self.key_requests = counter(
            "gmlp_api_key_requests",
            "requests that needed a scope, by the key's configured name (anonymous: no keys configured or "
            "none sent; invalid: an unknown key), transport and outcome (allowed, unauthenticated, "
            "forbidden, rate_limited)",
            ["key", "transport", "outcome"],
        )
        self.api_keys = alike("gmlp_api_keys", "API keys loaded from GMLP_API_KEYS_FILE")
        self.file_reloads = counter(
            "gmlp_file_reloads",
            "re-reads of a changed keys or TLS file, by file (api_keys, tls) and result (ok, error: the "
            "old contents stay in force)",
            ["file", "result"],
        )
        # --- prediction quality ---
        # What the models answer, as the drift signal: a shift in the top-1 labels or a fall in the
        # confidence or the margin between the first and second answer (docs/service.md).
        self.prediction_top1 = counter(
            "gmlp_prediction_top1",
            "top-1 label of each classified image (labels: the model's own)",
            ["model", "version", "label"],
        )
        self.prediction_confidence = histogram(
            "gmlp_prediction_confidence",
            "softmax probability of the top-1 answer (fill-mask: per [MASK])",
            ["model", "version"],
            buckets=QUALITY_BUCKETS,
        )
        self.prediction_margin = histogram(
            "gmlp_prediction_margin",
            "softmax probability of the top-1 answer minus the second's (fill-mask: per [MASK])",
            ["model", "version"],
            buckets=QUALITY_BUCKETS,
        )
        # --- what the alert rules compare with (deploy/observability/rules.yml) ---
        # Capacity and instances are summed like the depth, so depth / capacity stays a fraction.
        self.queue_capacity = summed(
            "gmlp_queue_capacity", "waiting requests per model version before 503 (max_queue_size)", MV
        )
        self.model_instances = summed(
            "gmlp_model_instances", "execution instances of the model version (batches run at once)", MV
        )
        self.request_timeout = alike(
            "gmlp_request_timeout_seconds", "deadline of a request from its arrival (request_timeout_s)"
        )
        # --- model lifecycle ---
        self.model_versions = alike(
            "gmlp_model_versions",
            "model versions known to the service by state (READY, LOADING, UNLOADING, UNAVAILABLE)",
            ["state"],
        )
        self.version_loads = counter(
            "gmlp_model_version_loads", "versions loaded, warmed up and checked", ["model"]
        )
        self.version_unloads = counter("gmlp_model_version_unloads", "versions drained and closed", ["model"])
        self.version_refusals = counter(
            "gmlp_model_version_refusals",
            "loads refused by reason (load_failed: the load, warm-up or check failed; too_many_versions)",
            ["model", "reason"],
        )
        self.version_requests = counter(
            "gmlp_model_version_requests",
            "requests answered by a model version (every task API and v2, REST and gRPC)",
            ["model", "version"],
        )
        # --- the model repository (contract.scan, service.lifecycle.poller) ---
        self.repository_problems = alike(
            "gmlp_repository_problems",
            "problems the latest repository scan found (models and versions listed UNAVAILABLE with "
            "the reason: malformed or incomplete directories, duplicate names, ignored entries)",
        )
        self.poller_restarts = counter(
            "gmlp_repository_poller_restarts",
            "times the repository poller failed and was restarted (poll model control)",
        )
        for state in ("READY", "LOADING", "UNLOADING", "UNAVAILABLE"):
            self.model_versions.labels(state).set(0)

    def refused(self, transport: str, code: str) -> None:
        """An error answer, by transport and machine code (what was wrong, what was shed)."""
        self.refusals.labels(transport, code).inc()

    def connection_closed(self, transport: str, reason: str) -> None:
        """A connection the server closed to keep a connection cap."""
        self.connections_closed.labels(transport, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.exposed)


class ModelObserver(BatchObserver):
    """The metrics of one model version's batcher: queue depth, refusals, batch sizes and times,
    and the version's statistics (`service.telemetry.statistics`), fed from the same batch."""

    def __init__(self, metrics: ServiceMetrics, model: str, version: str) -> None:
        self._depth = metrics.queue_depth.labels(model, version)
        self._batch = metrics.batch_size.labels(model)
        self._wait = metrics.queue_wait.labels(model)
        self._inference = metrics.inference.labels(model)
        self._rejections = metrics.rejections
        self._model, self._version = model, version
        series = self._series = metrics.statistics
        self._inferences = series.inferences.labels(model, version)
        self._executions = series.executions.labels(model, version)
        self._queue = series.queue_seconds.labels(model, version)
        self._compute = series.compute_seconds.labels(model, version)
        self._last = series.last_inference.labels(model, version)
        for outcome in ("success", "fail"):  # listed at zero from the start
            series.requests.labels(model, version, outcome)
            series.request_seconds.labels(model, version, outcome)
        self._depth.set(0)

    def queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def rejected(self, reason: str) -> None:
        self._rejections.labels(self._model, reason).inc()

    def batch_done(self, run: BatchRun) -> None:
        waits = [run.started - enqueued for enqueued in run.enqueued]  # each row's, to the batch's start
        run_seconds = run.done - run.started
        self._batch.observe(run.size)
        self._inference.observe(run_seconds)
        for wait in waits:
            self._wait.observe(wait)
        size = str(run.size)
        self._inferences.inc(run.size)
        self._executions.inc()
        self._queue.inc(sum(waits))
        self._compute.inc(run_seconds * run.size)
        self._series.batch_executions.labels(self._model, self._version, size).inc()
        self._series.batch_seconds.labels(self._model, self._version, size).inc(run_seconds)
        self._last.set(time.time())


class PredictionMetrics:
    """Records what one model version answers: the top-1 label (classifiers), the top-1 softmax
    probability and its margin over the second, from the logits of each prediction."""

    def __init__(
        self, metrics: ServiceMetrics, model: str, version: str, labels: Sequence[str] | None
    ) -> None:
        self._confidence = metrics.prediction_confidence.labels(model, version)
        self._margin = metrics.prediction_margin.labels(model, version)
        # One child per label, made up front: the label set is the model's, never the input's.
        self._top1 = [metrics.prediction_top1.labels(model, version, label) for label in labels or ()]

    def observe_rows(self, logits: list[np.ndarray], ranked: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """A batch's predictions: `logits` rows ([rows, answers]; fewer than two answers have no
        margin), and (ids, probabilities) from top-k outputs ([rows, K], best first, K >= 2)."""
        if logits and logits[0].shape[-1] >= 2:
            rows = np.concatenate(logits).astype(np.float64)
            shifted = np.exp(rows - rows.max(axis=-1, keepdims=True))
            probs = shifted / shifted.sum(axis=-1, keepdims=True)
            top2 = np.sort(np.partition(probs, -2, axis=-1)[:, -2:], axis=-1)[:, ::-1]
            self._record(np.argmax(rows, axis=-1), top2)
        if ranked:
            ids, probabilities = (np.concatenate(part) for part in zip(*ranked, strict=True))
            self._record(ids[:, 0], probabilities[:, :2])

    def _record(self, top1: np.ndarray, top2: np.ndarray) -> None:
        """Each prediction's top-1 index and its two best probabilities (best first). A prediction
        whose probabilities are not finite (a model's NaN or infinite logits) is left out of the
        histograms: one NaN would make their sums NaN for as long as the process runs."""
        for first, second in top2.astype(np.float64).tolist():
            if math.isfinite(first - second):
                self._confidence.observe(first)
                self._margin.observe(first - second)
        if self._top1:
            for index in top1.tolist():
                self._top1[int(index)].inc()


class LifecycleMetrics:
    """What the version table (`service.lifecycle.versions`) reports; `changed()` runs after every
    change of a version's state (the table reports each one, a version added or removed included)."""

    def __init__(self, metrics: ServiceMetrics, changed: Callable[[], None]) -> None:
        self._metrics = metrics
        self._changed = changed

    def state_changed(self, model: str, version: int, old: str | None, new: str | None) -> None:
        if old is not None:
            self._metrics.model_versions.labels(old).dec()
        if new is not None:
            self._metrics.model_versions.labels(new).inc()
        self._changed()

    def loaded(self, model: str) -> None:
        self._metrics.version_loads.labels(model).inc()

    def unloaded(self, model: str) -> None:
        self._metrics.version_unloads.labels(model).inc()

    def closed(self, model: str, version: int) -> None:
        """A version was retired: its batcher's gauges go (not left behind at their last value)."""
        metrics = self._metrics
        for gauge in (metrics.queue_depth, metrics.queue_capacity, metrics.model_instances):
            # In multiprocess mode remove() leaves the value in this worker's file (prometheus_client
            # only warns): a zero there drops the retired version out of the sum over workers.
            if MULTIPROCESS:
                gauge.labels(model, str(version)).set(0)
            else:
                with suppress(KeyError):
                    gauge.remove(model, str(version))

    def refused(self, model: str, reason: str) -> None:
        self._metrics.version_refusals.labels(model, reason).inc()

    def leased(self, model: str, version: int) -> None:
        self._metrics.version_requests.labels(model, str(version)).inc()
