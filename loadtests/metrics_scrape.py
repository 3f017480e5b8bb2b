"""Read the service's own view of a load step from GET /metrics: batch sizes and rejections.

Locust sees latency and throughput from outside; only the server knows how many requests each
model run carried. Prometheus counters and histograms are cumulative since the process started
(warm-up batches included), so a step's figures are the difference between a scrape just before
and one just after it. Other traffic during the step is counted too: run against a quiet server.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

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


# Cumulative totals at one instant, by (sample name, model, reason): the batch-size histogram's
# sum and count per model, and the rejection counters per model and reason.
Snapshot = Counter[tuple[str, str, str]]
_BATCH_SUM, _BATCH_COUNT = f"{BATCH_SIZE_METRIC}_sum", f"{BATCH_SIZE_METRIC}_count"
_REJECTED = f"{REJECTIONS_METRIC}_total"


def sample_totals(text: str, key: Callable[[Sample], Hashable | None]) -> Counter[Any]:
    """The samples of Prometheus text summed by `key(sample)` (None: left out).

    Samples are told apart by their names, not their families': the parser names a counter's
    family with or without `_total` depending on how the TYPE line is written. prometheus-client
    (the `loadtest` extra) is imported here, since `http_get` runs in the serving install too."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: Counter[Any] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (group := key(sample)) is not None:
                totals[group] += sample.value
    return totals


def parse_metrics(text: str) -> Snapshot:
    """The batch-size histogram totals and the rejection counters of Prometheus text."""
    return sample_totals(
        text,
        lambda s: (
            (s.name, s.labels.get("model", ""), s.labels.get("reason", ""))
            if s.name in (_BATCH_SUM, _BATCH_COUNT, _REJECTED)
            else None
        ),
    )


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
    delta = after - before  # a Counter keeps the increases only
    return {
        model: BatchStats(batches=round(count), requests=round(delta[(_BATCH_SUM, model, "")]))
        for (name, model, _), count in delta.items()
        if name == _BATCH_COUNT and round(count) > 0
    }


def overall(stats: Iterable[BatchStats]) -> BatchStats:
    """All models together: the mean batch size weighted by batches, i.e. requests per model run."""
    items = list(stats)
    return BatchStats(batches=sum(s.batches for s in items), requests=sum(s.requests for s in items))


def rejections_delta(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Requests refused by the batchers during the step, by "model/reason" (nonzero only)."""
    return {
        f"{model}/{reason}": round(count)
        for (name, model, reason), count in (after - before).items()
        if name == _REJECTED and round(count) > 0
    }
