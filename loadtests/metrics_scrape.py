"""Read the service's own view of a load step from GET /metrics: batch sizes and rejections.

Locust sees latency and throughput from outside; only the server knows how many requests each
model run carried. Prometheus counters and histograms are cumulative since the process started
(warm-up batches included), so a step's figures are the difference between a scrape just before
and one just after it. Other traffic during the step is counted too: run against a quiet server.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

BATCH_SIZE_METRIC = "gmlp_batch_size"  # histogram labelled by model (service/telemetry/metrics.py)
REJECTIONS_METRIC = "gmlp_rejections"  # counter labelled by model and reason


def http_get(url: str, timeout_s: float = 10.0) -> bytes:
    """The body of a GET that answered 2xx (urllib raises OSError subclasses otherwise). Standard
    library only: the runner, `gmlp tune` and the benchmarks' server processes use it in a slim
    image."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """The decoded JSON body of a GET that answered 2xx."""
    return json.loads(http_get(url, timeout_s))


@dataclass(frozen=True)
class Snapshot:
    """Cumulative totals at one instant: per model (sum, count) of the batch-size histogram, rejections."""

    batch: dict[str, tuple[float, float]]
    rejections: dict[tuple[str, str], float]


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample (prometheus-client is in the `loadtest` extra; imported
    here, since `http_get` runs in the serving install too)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def parse_metrics(
    text: str, batch_metric: str = BATCH_SIZE_METRIC, rejections_metric: str = REJECTIONS_METRIC
) -> Snapshot:
    """Extract the batch-size histogram totals and the rejection counters from Prometheus text."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    rejections: dict[tuple[str, str], float] = {}
    # Dispatch on sample names, not family names: the parser names a counter's family with or
    # without `_total` depending on how the TYPE line is written.
    for name, labels, value in _samples(text):
        if name == f"{batch_metric}_sum":
            sums[labels.get("model", "")] = value
        elif name == f"{batch_metric}_count":
            counts[labels.get("model", "")] = value
        elif name == f"{rejections_metric}_total":
            rejections[(labels.get("model", ""), labels.get("reason", ""))] = value
    batch = {model: (sums.get(model, 0.0), counts.get(model, 0.0)) for model in sums.keys() | counts.keys()}
    return Snapshot(batch=batch, rejections=rejections)


def scrape(base_url: str, timeout_s: float = 10.0) -> Snapshot | None:
    """A snapshot of `base_url`/metrics, or None when the endpoint cannot be read (report says n/a)."""
    try:
        text = http_get(f"{base_url.rstrip('/')}/metrics", timeout_s).decode("utf-8")
        return parse_metrics(text)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class BatchStats:
    """Batches run and requests they carried during one step, for one model (or all)."""

    batches: int
    requests: int

    @property
    def mean(self) -> float | None:
        return self.requests / self.batches if self.batches else None

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "requests": self.requests, "mean": self.mean}


def batch_delta(before: Snapshot, after: Snapshot) -> dict[str, BatchStats]:
    """Per model, the batches that ran between the two snapshots (models without batches left out)."""
    out = {}
    for model, (sum_after, count_after) in after.batch.items():
        sum_before, count_before = before.batch.get(model, (0.0, 0.0))
        batches = round(count_after - count_before)
        if batches > 0:
            out[model] = BatchStats(batches=batches, requests=round(sum_after - sum_before))
    return out


def overall(stats: Iterable[BatchStats]) -> BatchStats:
    """All models together: the mean batch size weighted by batches, i.e. requests per model run."""
    items = list(stats)
    return BatchStats(batches=sum(s.batches for s in items), requests=sum(s.requests for s in items))


def rejections_delta(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Requests refused by the batchers during the step, by "model/reason" (nonzero only)."""
    out = {}
    for (model, reason), value in after.rejections.items():
        delta = round(value - before.rejections.get((model, reason), 0.0))
        if delta > 0:
            out[f"{model}/{reason}"] = delta
    return out
