"""Run locust headless once per concurrency level and collect what each step measured.

Each step is a separate `python -m locust` process (fresh statistics, its own CSV and HTML
report, and a hard subprocess timeout so a hung run cannot hang the sweep), bracketed by two
/metrics scrapes for the server-side batch sizes. Nothing here imports locust: the runner only
reads the files locust writes.

Locust sees latency and throughput from outside; only the server knows how many requests each
model run carried. Prometheus counters and histograms are cumulative since the process started
(warm-up batches included), so a step's figures are the difference between a scrape just before
and one just after it. Other traffic during the step is counted too: run against a quiet server.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.errors import UserError

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

# Our own module file (locust loads a locustfile by path), wherever the package is installed.
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
AGGREGATED = "Aggregated"
# Locust needs a few seconds to start (loading the inputs) and to stop; beyond that it is hung.
STARTUP_SLACK_S = 60.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([hms]?)")


def parse_duration(text: str) -> float:
    """Seconds in a locust-style duration: "30s", "2m", "1h30m", "90" (seconds)."""
    text = text.strip().lower()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * {"h": 3600, "m": 60, "s": 1, "": 1}[match.group(2)]
        pos = match.end()
    if pos != len(text) or total <= 0:
        raise UserError(f"invalid duration {text!r}: use e.g. 30s, 2m, 1m30s")
    return total


def parse_users(text: str, flag: str = "--users") -> list[int]:
    """ "1,4,16,64" -> [1, 4, 16, 64] (each >= 1, kept in the given order), the value of `flag`."""
    try:
        users = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"invalid {flag} {text!r}: a comma-separated list of integers") from None
    if not users or min(users) < 1:
        raise UserError(f"invalid {flag} {text!r}: at least one count, each >= 1")
    return users


def http_get(
    url: str, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None, data: bytes | None = None
) -> bytes:
    """The body of a GET (a POST of `data` when given) that answered 2xx (urllib raises OSError
    subclasses otherwise). Standard library only: the runner, `gmlp tune` and the benchmarks'
    server processes use it in a slim image."""
    request = urllib.request.Request(url, data, dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


def get_json(
    url: str, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None, data: bytes | None = None
) -> Any:
    """The decoded JSON body of `http_get`."""
    return json.loads(http_get(url, timeout_s, headers, data))


# Cumulative totals at one instant, by (sample name, model, reason): the batch-size histogram's
# sum and count per model, and the rejection counters per model and reason (service/telemetry/).
Snapshot = Counter[tuple[str, str, str]]
_BATCH_SUM, _BATCH_COUNT, _REJECTED = "gmlp_batch_size_sum", "gmlp_batch_size_count", "gmlp_rejections_total"


def sample_totals(text: str, key: Callable[[Sample], Hashable | None]) -> Counter[Any]:
    """The samples of Prometheus text summed by `key(sample)` (None: left out).

    Samples are told apart by their names, not their families': the parser names a counter's
    family with or without `_total` depending on how the TYPE line is written. prometheus-client
    (the `loadtest` extra) is imported here, since `http_get` runs in the serving install too."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: defaultdict[Any, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (group := key(sample)) is not None:
                totals[group] += sample.value
    return Counter(totals)  # of floats: a Counter, for the deltas between two scrapes


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


def scrape(base_url: str) -> Snapshot | None:
    """A snapshot of `base_url`/metrics, or None when the endpoint cannot be read (report says n/a)."""
    try:
        return parse_metrics(http_get(f"{base_url.rstrip('/')}/metrics").decode("utf-8"))
    except (OSError, ValueError):
        return None


def batch_stats(batches: int, requests: int) -> dict[str, Any]:
    """Batches run during one step and the requests they carried, for one model (or all); the mean
    is requests per batch (None without batches)."""
    return {"batches": batches, "requests": requests, "mean": requests / batches if batches else None}


def batch_delta(before: Snapshot, after: Snapshot) -> dict[str, dict[str, Any]]:
    """Per model, the batches that ran between the two snapshots (models without batches left out)."""
    delta = after - before  # a Counter keeps the increases only
    return {
        model: batch_stats(round(count), round(delta[(_BATCH_SUM, model, "")]))
        for (name, model, _), count in delta.items()
        if name == _BATCH_COUNT and round(count) > 0
    }


def overall(stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """All models together: the mean batch size weighted by batches, i.e. requests per model run."""
    items = list(stats)
    return batch_stats(sum(s["batches"] for s in items), sum(s["requests"] for s in items))


def rejections_delta(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Requests refused by the batchers during the step, by "model/reason" (nonzero only)."""
    return {
        f"{model}/{reason}": round(count)
        for (name, model, reason), count in (after - before).items()
        if name == _REJECTED and round(count) > 0
    }


# The timing columns of locust's `_stats.csv` (ms; None where it writes N/A), by results.json key.
_TIMES = {
    "avg_ms": "Average Response Time",
    "p50_ms": "50%",
    "p95_ms": "95%",
    "p99_ms": "99%",
    "max_ms": "Max Response Time",
}


def _number(value: str | None) -> float | None:
    if value is None or value.strip() in ("", "N/A"):
        return None
    return float(value)


def read_stats_csv(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a locust `PREFIX_stats.csv` (an endpoint, or the Aggregated row), by name
    ("/classify", "Aggregated", ...): requests, failures, rps and the `_TIMES` in ms."""
    with path.open(newline="", encoding="utf-8") as f:
        return {
            row["Name"]: {
                "name": row["Name"],
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": _number(row["Requests/s"]) or 0.0,
                **{key: _number(row[column]) for key, column in _TIMES.items()},
            }
            for row in csv.DictReader(f)
        }


def read_failures_csv(path: Path) -> list[dict[str, Any]]:
    """Locust's `PREFIX_failures.csv` (what failed, how often), or its `PREFIX_exceptions.csv`
    (errors raised in the locustfile itself: a bug there, not a failed request) in the same shape;
    most frequent first, [] when the file is missing."""
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        rows = [
            {
                "method": r.get("Method", "exception"),
                "name": r.get("Name", "locustfile"),
                "error": r.get("Error") or r.get("Message", ""),
                "occurrences": int(r.get("Occurrences") or r["Count"]),
            }
            for r in csv.DictReader(f)
        ]
    return sorted(rows, key=lambda r: -r["occurrences"])


@dataclass
class StepResult:
    """Everything measured at one concurrency level."""

    users: int
    duration_s: float
    total: dict[str, Any] | None  # a row of `read_stats_csv`
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: dict[str, dict[str, Any]] = field(default_factory=dict)  # `batch_stats` by model
    batch_size_all: dict[str, Any] | None = None  # None when /metrics could not be read
    rejections: dict[str, int] = field(default_factory=dict)
    failure_messages: list[dict[str, Any]] = field(default_factory=list)
    locust_exit_code: int | None = None
    error: str | None = None  # the step did not run properly (timeout, crash, no CSV)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        """Failed requests; a step that did not complete, or that locust exited 1 on, counts as failing."""
        counted = self.total["failures"] if self.total else 0
        if self.error or (self.locust_exit_code not in (0, None) and counted == 0):
            return max(counted, 1)
        return counted

    def to_json(self) -> dict[str, Any]:
        """The step as results.json holds it."""
        return asdict(self) | {"failures": self.failures}


def run_step(args: argparse.Namespace, users: int, env: Mapping[str, str]) -> StepResult:
    """One locust run at `users` concurrent users, with /metrics scraped before and after: `gmlp
    loadtest`'s --url, --duration, --out and --spawn-rate, the `GMLP_LOADTEST_*` variables `env`
    for the locustfile."""
    duration_s = parse_duration(args.duration)
    # Absolute: locust runs with the step folder as its working directory, so a relative --csv
    # prefix would land in a nested copy of the path.
    out_dir = args.out.resolve()
    step_dir = out_dir / f"users-{users:03d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    prefix, html, log_file = step_dir / "locust", step_dir / "locust.html", step_dir / "locust.log"
    # locust runs in this interpreter, which imports the installed package: no PYTHONPATH needed.
    result = StepResult(users=users, duration_s=duration_s, total=None)
    before = scrape(args.url)
    cmd = [
        *(sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users)),
        *("-r", f"{args.spawn_rate or users:g}", "-t", f"{math.ceil(duration_s)}s", "--host", args.url),
        *("--csv", str(prefix), "--html", str(html), "--only-summary"),
    ]
    log.info("step: %d users for %s", users, args.duration)
    timeout = duration_s + STARTUP_SLACK_S
    with log_file.open("w", encoding="utf-8") as out:
        try:
            done = subprocess.run(
                cmd, cwd=step_dir, env={**os.environ, **env}, stdout=out, stderr=out, timeout=timeout
            )
            result.locust_exit_code = done.returncode
        except subprocess.TimeoutExpired:
            result.error = f"locust did not finish within {timeout:.0f} s (killed)"
    after = scrape(args.url)
    stats_csv = Path(f"{prefix}_stats.csv")
    if stats_csv.is_file():
        rows = read_stats_csv(stats_csv)
        result.total = rows.pop(AGGREGATED, None)
        result.endpoints = rows
    if result.total is None and result.error is None:
        tail = log_file.read_text(encoding="utf-8", errors="replace")[-2000:]
        result.error = f"locust exited {result.locust_exit_code} without statistics; log tail:\n{tail}"
    result.failure_messages = [
        row for kind in ("failures", "exceptions") for row in read_failures_csv(Path(f"{prefix}_{kind}.csv"))
    ]
    if before is not None and after is not None:
        result.batch_size = batch_delta(before, after)
        result.batch_size_all = overall(result.batch_size.values())
        result.rejections = rejections_delta(before, after)
    result.files = {
        name: str(path.relative_to(out_dir))
        for name, path in (
            ("stats_csv", stats_csv),
            ("failures_csv", Path(f"{prefix}_failures.csv")),
            ("html", html),
            ("log", log_file),
        )
        if path.is_file()
    }
    return result


def wait_ready(url: str, timeout_s: float) -> None:
    """Block until GET /health/ready answers 200 (bounded); the service warms up before it is ready."""
    deadline = time.monotonic() + timeout_s
    last: str = "no answer"
    while True:
        try:
            http_get(f"{url.rstrip('/')}/health/ready", timeout_s=5.0)
            return
        except OSError as exc:  # URLError and HTTPError (503 while loading) are OSErrors
            last = str(exc)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url} was not ready within {timeout_s:.0f} s ({last})")
        time.sleep(0.5)
