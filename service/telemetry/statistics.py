"""Per-model statistics kept as Prometheus series, and read back as one model's counters.

The batcher's observer (`service.telemetry.metrics.ModelObserver`, which feeds the batch metrics
too, in the same step) adds every executed batch to these series, and the protocol's inference
handlers every answered or refused request (`service.v2.inference.infer`); `/metrics` exposes the
series, and the Open Inference Protocol's statistics extension reads the same series back through
`StatisticsSeries.counters`, so the two can never disagree (with several workers, both read the
merge of every worker's series). Series are labelled by model and version.

What is counted where: `inferences` and `executions` count the rows and batches the model ran
(every API's traffic: task routes, Hugging Face API and v2 share the batcher); queue and compute
seconds are summed per row (a batch's run time counts once for each of its rows, and once per
batch in `by_batch_size`); `success` and `fail` count the protocol's inference requests, REST and
gRPC, with their durations inside the server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.samples import Sample


@dataclass
class Duration:
    """A count and the cumulative seconds of what was counted."""

    count: int = 0
    seconds: float = 0.0


@dataclass
class ModelCounters:
    """One model version's statistics since the server started."""

    version: str
    last_inference_s: float = 0.0  # Unix time of the last executed batch; 0: none yet
    inferences: int = 0  # rows run
    executions: int = 0  # batches run
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Duration = field(default_factory=Duration)
    by_batch_size: dict[int, Duration] = field(default_factory=dict)  # batch size -> executions, run time


def read(merged: CollectorRegistry | None) -> Callable[[MetricWrapperBase], list[Sample]]:
    """The samples of each metric as /metrics has them now. `merged` None (one process): each metric
    collected by itself, so that a read costs what it reads, not the whole registry. A registry of
    every worker's files: one collection, looked up by the metric's family name (what the merge knows
    a series by, not the local object)."""
    if merged is None:
        return lambda metric: [sample for family in metric.collect() for sample in family.samples]
    families = {family.name: family.samples for family in merged.collect()}
    return lambda metric: [sample for family in metric.describe() for sample in families.get(family.name, [])]


class StatisticsSeries:
    """The statistics' Prometheus series on one registry, read back from it (or from `merged`)."""

    def __init__(self, registry: CollectorRegistry, merged: CollectorRegistry | None) -> None:
        self._merged = merged
        mv = ["model", "version"]
        counter = partial(Counter, registry=registry)
        self.inferences = counter("gmlp_model_inferences", "rows run by the model", mv)
        self.executions = counter("gmlp_model_executions", "batches run by the model", mv)
        self.queue_seconds = counter(
            "gmlp_model_queue_seconds", "time rows waited in the batch queue, summed", mv
        )
        self.compute_seconds = counter(
            "gmlp_model_compute_seconds", "batch run time, counted once per row of the batch", mv
        )
        self.batch_executions = counter(
            "gmlp_model_batch_executions", "batches run, by batch size", [*mv, "batch_size"]
        )
        self.batch_seconds = counter(
            "gmlp_model_batch_compute_seconds", "batch run time, by batch size", [*mv, "batch_size"]
        )
        self.requests = counter(
            "gmlp_model_requests",
            "Open Inference Protocol inference requests by outcome (success, fail)",
            [*mv, "outcome"],
        )
        self.request_seconds = counter(
            "gmlp_model_request_seconds",
            "time inside the server of those requests, summed, by outcome",
            [*mv, "outcome"],
        )
        self.last_inference = Gauge(
            "gmlp_model_last_inference_timestamp_seconds",
            "Unix time of the last batch run",
            mv,
            registry=registry,
            multiprocess_mode="max",  # a dead worker's last batch still ran (as its counts still count)
        )

    def counters(self, keys: Sequence[tuple[str, str]]) -> list[ModelCounters]:
        """Each (model, version)'s statistics, read from the series /metrics exposes: one read for
        all of them (with several workers, one merge of their files)."""
        now = read(self._merged)
        return [self._counters(now, key) for key in keys]

    def _counters(
        self, now: Callable[[MetricWrapperBase], list[Sample]], key: tuple[str, str]
    ) -> ModelCounters:
        def samples(metric: Counter | Gauge, suffix: str = "_total") -> list[tuple[dict[str, str], float]]:
            return [
                (sample.labels, sample.value)
                for sample in now(metric)
                if sample.name.endswith(suffix) and (sample.labels["model"], sample.labels["version"]) == key
            ]

        def total(metric: Counter) -> float:
            return sum(value for _, value in samples(metric))

        def outcome(name: str) -> Duration:
            count, seconds = (
                sum(value for labels, value in samples(metric) if labels["outcome"] == name)
                for metric in (self.requests, self.request_seconds)
            )
            return Duration(int(count), seconds)

        inferences = int(total(self.inferences))
        sizes: dict[int, Duration] = {}
        for labels, value in samples(self.batch_executions):
            sizes.setdefault(int(labels["batch_size"]), Duration()).count = int(value)
        for labels, value in samples(self.batch_seconds):
            sizes.setdefault(int(labels["batch_size"]), Duration()).seconds = value
        last = [value for _, value in samples(self.last_inference, "")]
        return ModelCounters(
            version=key[1],
            last_inference_s=max(last, default=0.0),
            inferences=inferences,
            executions=int(total(self.executions)),
            success=outcome("success"),
            fail=outcome("fail"),
            queue=Duration(inferences, total(self.queue_seconds)),
            compute=Duration(inferences, total(self.compute_seconds)),
            by_batch_size=dict(sorted(sizes.items())),
        )
