"""What `gmlp tune` searches: candidate settings, the values each knob may take, and the two ways
through them (coordinate descent, or the full grid for comparison).

A candidate is one value per knob; it becomes `gmlp serve` flags for a measurement and `GMLP_*`
lines for the env file, both named after the `ServiceSettings` fields they set, so the tuner can
only write settings the service reads. A candidate's score is the best throughput it reached at a
concurrency whose p99 met the SLO without a failed request; a candidate that met it nowhere ranks
below every one that did, by its lowest p99 (so the descent still moves towards the SLO).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from contract.errors import UserError

QUEUE_DELAY_POLICIES = ("arriving", "always")
BACKENDS = ("onnxruntime", "openvino")


@dataclass(frozen=True, order=True)
class Candidate:
    """One setting of every knob (the `ServiceSettings` fields of the same names), in the order
    coordinate descent visits them: the variant and the split of the CPUs among worker processes,
    instances and threads first (they move throughput most), the batching knobs after, then the
    backend (OpenVINO reads the fp32 graph whatever the variant, so it is compared once the rest is
    settled), and last the threads of a lone request (0: on its instance's), which moves the
    latency of few clients rather than throughput."""

    variant: str
    workers: int
    instances: int
    intra_op_threads: int
    max_batch_size: int
    max_queue_delay_ms: float
    queue_delay_policy: str
    backend: str = "onnxruntime"
    lone_threads: int = 0

    def settings(self) -> dict[str, Any]:
        return asdict(self)

    def flags(self) -> list[str]:
        """`gmlp serve` flags that start a server with these settings."""
        return [arg for name, value in self.settings().items() for arg in (_flag(name), str(value))]

    def env_lines(self) -> list[str]:
        """`GMLP_NAME=value` lines (what `ServiceSettings` reads from the environment)."""
        return [f"GMLP_{name.upper()}={value}" for name, value in self.settings().items()]

    def label(self) -> str:
        return (
            f"{self.variant} {self.workers}w{self.instances}x{self.intra_op_threads}t b{self.max_batch_size} "
            f"{self.max_queue_delay_ms:g}ms {self.queue_delay_policy}"
            + ("" if self.backend == "onnxruntime" else f" {self.backend}")
            + (f" lone{self.lone_threads}" if self.lone_threads else "")
        )


KNOBS = tuple(f.name for f in fields(Candidate))
_TYPES = {f.name: str(f.type) for f in fields(Candidate)}  # "int", "float", "str" (annotations)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Space:
    """The values each knob may take, and how many CPUs a candidate may use in all."""

    values: Mapping[str, tuple[Any, ...]]
    cpus: int

    def fits(self, candidate: Candidate) -> bool:
        """Whether the candidate's workers, instances and threads fit the CPUs (more only
        oversubscribes)."""
        return candidate.workers * candidate.instances * candidate.intra_op_threads <= self.cpus

    def grid(self) -> list[Candidate]:
        """Every combination that fits the CPUs."""
        combos = itertools.product(*(self.values[k] for k in KNOBS))
        every = (Candidate(**dict(zip(KNOBS, combo, strict=True))) for combo in combos)
        return [c for c in every if self.fits(c)]

    def neighbours(self, centre: Candidate, knob: str) -> list[Candidate]:
        """`centre` with `knob` set to each of its values (centre included), those that fit."""
        return [c for v in self.values[knob] if self.fits(c := replace(centre, **{knob: v}))]


def power_of_two_steps(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    return (*(2**i for i in range((limit - 1).bit_length())), limit)


def parse_values(knob: str, text: str) -> tuple[Any, ...]:
    """A knob's comma-separated values from the command line, checked for their type and range."""
    kind: Callable[[str], Any] = {"int": int, "float": float, "str": str}[_TYPES[knob]]
    given = f"{_flag(knob)} {text!r}"
    try:
        values = tuple(dict.fromkeys(kind(part.strip()) for part in text.split(",") if part.strip()))
    except ValueError:
        raise UserError(f"{given}: comma-separated {kind.__name__} values") from None
    if not values:
        raise UserError(f"{given}: give at least one value")
    least = 0 if knob == "lone_threads" else 1  # 0 threads for a lone request: on its instance's
    if kind is int and min(values) < least:
        raise UserError(f"{given}: every value must be >= {least}")
    if kind is float and min(values) < 0:
        raise UserError(f"{given}: every value must be >= 0")
    if knob == "backend" and set(values) - set(BACKENDS):
        raise UserError(f"{given}: choose from {', '.join(BACKENDS)}")
    if knob == "queue_delay_policy" and set(values) - set(QUEUE_DELAY_POLICIES):
        raise UserError(f"{given}: the policies are {', '.join(QUEUE_DELAY_POLICIES)}")
    return values


def meets(level: dict[str, Any], slo_p99_ms: float) -> bool:
    """Whether a level's p99 met the SLO without a single failed request."""
    return bool(level["requests"]) and not level["failures"] and level["p99_ms"] <= slo_p99_ms


@dataclass
class Measured:
    """A candidate's measurement: one summary per concurrency level (see `LoadResult.summary`)."""

    candidate: Candidate
    levels: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # concurrency levels not run (SLO missed below)
    seconds: float = 0.0
    error: str | None = None
    served: dict[str, Any] = field(default_factory=dict)

    def best_level(self, slo_p99_ms: float) -> dict[str, Any] | None:
        """The level with the most requests per second among those that met the SLO."""
        return max(
            (lv for lv in self.levels if meets(lv, slo_p99_ms)), key=lambda lv: lv["rps"], default=None
        )

    def rank(self, slo_p99_ms: float) -> tuple[int, float]:
        """Higher is better: (1, throughput) when the SLO was met, else (0, -lowest p99)."""
        best = self.best_level(slo_p99_ms)
        if best is not None:
            return 1, float(best["rps"])
        p99s = [level["p99_ms"] for level in self.levels if level["p99_ms"] is not None]
        return 0, -min(p99s, default=float("inf"))


def coordinate_descent(
    space: Space, start: Candidate, measure: Callable[[Candidate], Measured | None], slo_p99_ms: float
) -> Iterator[Measured]:
    """Coordinate descent from `start`: for each knob in turn, every value with the others held at
    the best so far; the best becomes the new centre. Passes repeat until one changes nothing.
    `measure` returns None when the budget is spent (the search stops there); each candidate is
    measured once and yielded as it is."""
    seen: dict[Candidate, Measured] = {}
    centre, changed = start, True
    while changed:
        changed = False
        for knob in KNOBS:
            near = space.neighbours(centre, knob)
            for candidate in (centre, *near):
                if candidate not in seen:
                    if (result := measure(candidate)) is None:
                        return
                    seen[candidate] = result
                    yield result
            # (no value of this knob may fit the CPUs beside the centre's others: `best` is None)
            best = max((seen[c] for c in near), key=lambda m: m.rank(slo_p99_ms), default=None)
            if best is not None and best.rank(slo_p99_ms) > seen[centre].rank(slo_p99_ms):
                centre, changed = best.candidate, True


def full_grid(
    space: Space, start: Candidate, measure: Callable[[Candidate], Measured | None]
) -> Iterator[Measured]:
    """Every candidate of the grid, `start` first (it is measured anyway, for the served facts)."""
    for candidate in [start, *(c for c in space.grid() if c != start)]:
        result = measure(candidate)
        if result is None:
            return
        yield result


def best_of(results: Sequence[Measured], slo_p99_ms: float) -> Measured | None:
    """The candidate with the highest throughput that met the SLO, or None when none did."""
    meeting = [m for m in results if m.best_level(slo_p99_ms) is not None]
    return max(meeting, key=lambda m: m.rank(slo_p99_ms), default=None)
