"""Results -> the "Against other servers" section of docs/benchmarks.md.

Every figure is a median over rounds; the table shows the range over rounds beside it when
there was more than one, since on a shared machine the spread is part of the result.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

BEGIN = "<!-- peers:begin (written by benchmarks/peers/run.py) -->"
END = "<!-- peers:end -->"
HEADING = "## Against other servers"
TABLE_LEVELS = (8, 32, 64)
CPU_LEVEL = 32


def spread(values: Iterable[float], digits: int = 0) -> str:
    """The median of a figure over rounds, with its range when there was more than one round ("-"
    where nothing was measured)."""
    vals = [v for v in values if v == v]  # drop NaN
    if not vals:
        return "-"
    text = f"{statistics.median(vals):.{digits}f}"
    return text + (f" ({min(vals):.{digits}f}-{max(vals):.{digits}f})" if len(vals) > 1 else "")


def figures(rows: Sequence[dict[str, Any]], peer: str, c: int, key: str) -> list[float]:
    """One figure of `peer` at `c` clients, each round's (NaN where a row lacks it)."""
    return [r.get(key, float("nan")) for r in rows if r["peer"] == peer and r["concurrency"] == c]


def median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else None


def floors(results: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """The runs without HTTP, each round's: the bare pipeline and raw `session.run` beside it."""
    bare = results.get("bare") or []
    return {"raw": [b["raw"] for b in bare], "bare": bare}


def table(results: dict[str, Any], labels: dict[str, str]) -> str:
    """The markdown comparison table: c=1 p50, req/s at 8/32/64, CPU/request at 32, one row each."""
    rows = results["rows"]
    head = (
        "| server | c=1 p50 ms | "
        + " | ".join(f"c={c} req/s" for c in TABLE_LEVELS)
        + f" | server CPU ms/request (c={CPU_LEVEL}) | background CPU % (c={CPU_LEVEL}) |\n|---|---:|"
        + "---:|" * len(TABLE_LEVELS)
        + "---:|---:|\n"
    )
    lines = []
    for key, label in labels.items():
        if not any(r["peer"] == key for r in rows):
            continue
        cells = [spread(figures(rows, key, 1, "p50_ms"), 1)]
        cells += [spread(figures(rows, key, c, "rps")) for c in TABLE_LEVELS]
        cells.append(spread(figures(rows, key, CPU_LEVEL, "cpu_ms_per_request"), 2))
        cells.append(spread(figures(rows, key, CPU_LEVEL, "others_cpu_pct")))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    # The floors beside the servers (no HTTP): raw ORT, and the bare pipeline when it was run.
    labels = {
        "raw": "raw `session.run`, batch 16 (no HTTP)",
        "bare": "bare pipeline: decode, batch 16, rank (no HTTP)",
    }
    for key, runs in floors(results).items():
        if runs:
            label, empty = labels[key], " |" * (len(TABLE_LEVELS) - 2)
            rps, ms = (
                spread(r["requests_per_s"] for r in runs),
                spread((r["cpu_ms_per_request"] for r in runs), 2),
            )
            lines.append(f"| {label} | |{empty} {rps} images/s | | {ms} per image | |")
    return head + "\n".join(lines) + "\n"


def ratios(results: dict[str, Any], labels: dict[str, str], ours: str = "gmlp-serve") -> list[str]:
    """gmlp-serve against the best other server at each level, and against raw ORT."""
    rows = results["rows"]
    others = [k for k in labels if not k.startswith(ours)]
    out = []
    # (clients, figure, which peer is the one to beat, what is compared, whose figure)
    against = [
        (1, "p50_ms", min, "c=1 p50", "the lowest peer's"),
        *((c, "rps", max, f"c={c} req/s", "the best peer's") for c in TABLE_LEVELS),
        (
            CPU_LEVEL,
            "cpu_ms_per_request",
            min,
            f"c={CPU_LEVEL} server CPU per request",
            "the most frugal peer's",
        ),
    ]
    for c, key, pick, what, whose in against:
        mine = median(figures(rows, ours, c, key))
        theirs = [(k, m) for k in others if (m := median(figures(rows, k, c, key))) is not None]
        if mine is not None and theirs:
            peer, value = pick(theirs, key=lambda kv: kv[1])
            out.append(f"{what}: {mine / value:.2f}x {whose} ({labels[peer]})")
    mine32 = median(figures(rows, ours, CPU_LEVEL, "rps"))
    cpu32 = median(figures(rows, ours, CPU_LEVEL, "cpu_ms_per_request"))
    names = {"raw": ("raw session.run images/s", "raw ORT CPU per image")}
    names["bare"] = ("the bare pipeline's images/s", "the bare pipeline's CPU per image")
    for key, runs in floors(results).items():
        if runs and mine32 is not None and cpu32 is not None:
            rps = statistics.median(r["requests_per_s"] for r in runs)
            cpu = statistics.median(r["cpu_ms_per_request"] for r in runs)
            out.append(f"c={CPU_LEVEL} req/s: {mine32 / rps:.2f}x {names[key][0]}")
            out.append(f"c={CPU_LEVEL} server CPU per request: {cpu32 / cpu:.2f}x {names[key][1]}")
    return out


def replace_section(
    doc: str, section: str, begin: str = BEGIN, end: str = END, heading: str = HEADING
) -> str:
    """Put `section` between the markers, or append it (with its heading) when they are absent."""
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in doc and end in doc:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    return doc.rstrip() + f"\n\n{heading}\n\n{block}\n"
