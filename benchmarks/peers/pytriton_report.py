"""perf_analyzer rows of gmlp-serve and PyTriton -> medians over rounds -> the comparison table.

A `Run` is one perf_analyzer measurement (one server, transport and load, in one round) reduced to
the three figures the table shows. Each figure in the table is the median over the rounds of that
server, transport and load; the ratio column divides gmlp-serve's median by PyTriton's.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

GMLP, PYTRITON = "gmlp-serve", "pytriton"
POISSON = "poisson"


@dataclass(frozen=True)
class Run:
    """One perf_analyzer run: `load` is `c=N` (closed loop) or `poisson` (open loop at `rate`/s)."""

    round: int
    server: str
    transport: str
    load: str
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    rate: float = 0.0

    @classmethod
    def from_csv_row(cls, row: dict[str, str], *, round: int, server: str, transport: str, load: str) -> Run:
        """From a row of perf_analyzer's `-f` CSV (latencies there are in microseconds; an open-loop
        row has the `Request Rate` it was asked for)."""
        return cls(
            round,
            server,
            transport,
            load,
            float(row["Inferences/Second"]),
            float(row["p50 latency"]) / 1000,
            float(row["p99 latency"]) / 1000,
            float(row.get("Request Rate") or 0.0),
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def closed_loads(levels: Iterable[int]) -> list[str]:
    return [f"c={c}" for c in levels]


def median(runs: Sequence[Run], server: str, transport: str, load: str, field: str) -> float | None:
    """The median of `field` over the rounds of (server, transport, load); None when none ran."""
    values = [
        float(getattr(r, field))
        for r in runs
        if r.server == server and r.transport == transport and r.load == load
    ]
    return statistics.median(values) if values else None


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if mine is None or not theirs else f"{mine / theirs:.2f}x"


def _load_label(runs: Sequence[Run], transport: str, load: str, fraction: float) -> str:
    if load != POISSON:
        clients = int(load.removeprefix("c="))
        return f"{clients} client" + ("s" if clients > 1 else "")
    rates = [median(runs, s, transport, POISSON, "rate") for s in (GMLP, PYTRITON)]
    return f"Poisson, {fraction:g}x capacity ({_num(rates[0], 0)} / {_num(rates[1], 0)} per s)"


def table(runs: Sequence[Run], transports: Sequence[str], loads: Sequence[str], fraction: float) -> str:
    """The markdown table: per transport and load, infer/s and p50/p99 of both servers and ratios."""
    lines = [
        "| transport | load | gmlp-serve infer/s | PyTriton infer/s | infer/s ratio "
        "| gmlp-serve p50 / p99 ms | PyTriton p50 / p99 ms | p99 ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for transport in transports:
        for load in loads:
            figures = {
                (s, f): median(runs, s, transport, load, f)
                for s in (GMLP, PYTRITON)
                for f in ("infer_per_s", "p50_ms", "p99_ms")
            }
            if all(v is None for v in figures.values()):
                continue
            cells = [
                "REST" if transport == "http" else "gRPC",
                _load_label(runs, transport, load, fraction),
                _num(figures[GMLP, "infer_per_s"], 0),
                _num(figures[PYTRITON, "infer_per_s"], 0),
                _ratio(figures[GMLP, "infer_per_s"], figures[PYTRITON, "infer_per_s"]),
                f"{_num(figures[GMLP, 'p50_ms'], 1)} / {_num(figures[GMLP, 'p99_ms'], 1)}",
                f"{_num(figures[PYTRITON, 'p50_ms'], 1)} / {_num(figures[PYTRITON, 'p99_ms'], 1)}",
                _ratio(figures[GMLP, "p99_ms"], figures[PYTRITON, "p99_ms"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
