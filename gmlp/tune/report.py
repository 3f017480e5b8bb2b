"""What `gmlp tune` writes: the chosen settings as an env file, and a report of every candidate
(results.json, report.md, and report.png when matplotlib is installed).

The env file holds `GMLP_*` lines only (comments above them say what was measured), so it can be
given to `docker run --env-file`, a Kubernetes ConfigMap or `set -a; . tuned.env` unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gmlp.tune.space import Measured, best_of, meets

ENV_FILE = "tuned.env"


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_document(results: Sequence[Measured], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything measured, as JSON (the report and the benchmark read it)."""
    slo = float(meta["slo_p99_ms"])
    best = best_of(results, slo)
    return {
        **meta,
        "chosen": None if best is None else _entry(best, slo),
        "candidates": [_entry(m, slo) for m in results],
    }


def _entry(m: Measured, slo: float) -> dict[str, Any]:
    best = m.best_level(slo)
    return {
        "label": m.candidate.label(),
        "settings": m.candidate.settings(),
        "served": m.served,
        "levels": m.levels,
        "skipped_concurrency": m.skipped,
        "met_slo": best is not None,
        "best_level": best,
        "seconds": round(m.seconds, 2),
        "error": m.error,
    }


def write_env(path: Path, chosen: Measured, slo: float) -> Path:
    best = chosen.best_level(slo)
    assert best is not None, "only a candidate that met the SLO is written"
    lines = [
        f"# gmlp tune: the highest throughput measured with p99 <= {slo:g} ms and no failed request",
        f"# {best['rps']:.1f} req/s, p50 {best['p50_ms']:.1f} ms, p99 {best['p99_ms']:.1f} ms "
        f"at {best['concurrency']} concurrent clients ({chosen.candidate.label()})",
        *chosen.candidate.env_lines(),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_markdown(path: Path, document: dict[str, Any]) -> Path:
    slo = document["slo_p99_ms"]
    chosen = document["chosen"]
    lines = [
        f"# gmlp tune: {document['model']}",
        "",
        f"- mode: {document['mode']}; SLO: p99 <= {slo:g} ms with no failed request",
        f"- concurrency: {', '.join(map(str, document['concurrency']))}; "
        f"window {document['seconds']:g} s after {document['warmup_s']:g} s of warm-up per level",
        f"- candidates measured: {len(document['candidates'])} in {document['elapsed_s']:.0f} s"
        + (f"; stopped early: {document['stopped']}" if document.get("stopped") else ""),
        f"- machine: {document['machine']}",
        "",
    ]
    if chosen is None:
        lines += ["No candidate met the SLO: no env file was written.", ""]
    else:
        best = chosen["best_level"]
        lines += [
            f"**Chosen**: {chosen['label']}: {best['rps']:.1f} req/s with p99 {best['p99_ms']:.1f} ms "
            f"at {best['concurrency']} clients (written to {ENV_FILE}).",
            "",
        ]
    lines += [
        "| # | candidate | clients | req/s | p50 ms | p99 ms | failures | server CPU ms/req | SLO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, entry in enumerate(document["candidates"], 1):
        if entry["error"]:
            first_line = entry["error"].splitlines()[0][:160]
            lines.append(f"| {i} | {entry['label']} | - | - | - | - | - | - | failed: {first_line} |")
        for level in entry["levels"]:
            lines.append(
                f"| {i} | {entry['label']} | {level['concurrency']} | {level['rps']:.1f} | "
                f"{_fmt(level['p50_ms'])} | {_fmt(level['p99_ms'])} | {level['failures']} | "
                f"{_fmt(level['server_cpu_ms'], 2)} | {'met' if meets(level, slo) else 'missed'} |"
            )
        if entry["skipped_concurrency"]:
            skipped = ", ".join(map(str, entry["skipped_concurrency"]))
            lines.append(
                f"| {i} | {entry['label']} | {skipped} | - | - | - | - | - | not run: missed below |"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def write_plot(path: Path, document: dict[str, Any]) -> str | None:
    """Throughput against p99, one point per candidate and level; None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'gmlp-serve[loadtest]'): no plot"
    slo = document["slo_p99_ms"]
    fig, ax = plt.subplots(figsize=(8, 5))
    many = len(document["candidates"]) > 12  # beyond that a legend of candidates hides the plot
    for i, entry in enumerate(document["candidates"], 1):
        levels = [lv for lv in entry["levels"] if lv["p99_ms"] is not None]
        if levels:
            xs, ys = [lv["p99_ms"] for lv in levels], [lv["rps"] for lv in levels]
            ax.plot(xs, ys, marker="o", alpha=0.6, label=None if many else f"#{i} {entry['label']}")
    chosen = document["chosen"]
    if chosen is not None:
        best = chosen["best_level"]
        ax.scatter([best["p99_ms"]], [best["rps"]], s=180, facecolors="none", edgecolors="black", zorder=3)
        ax.annotate("chosen", (best["p99_ms"], best["rps"]), textcoords="offset points", xytext=(8, 8))
    ax.axvline(slo, color="red", linestyle="--", label=f"SLO p99 {slo:g} ms")
    ax.set_xscale("log")  # latencies of a good and a queueing candidate differ by orders of magnitude
    ax.set_xlabel("p99 latency (ms, log scale)")
    ax.set_ylabel("requests per second")
    ax.set_title(f"gmlp tune: {document['model']}, one line per candidate (points: concurrency levels)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(out: Path, results: Sequence[Measured], meta: dict[str, Any]) -> dict[str, Any]:
    """results.json, report.md, report.png (if it can) and tuned.env (if a candidate met the SLO);
    returns the results document, with `files` (what was written) and `notes` added."""
    out.mkdir(parents=True, exist_ok=True)
    document = results_document(results, meta)
    files = [str(write_markdown(out / "report.md", document))]
    notes = []
    why_not = write_plot(out / "report.png", document)
    if why_not is None:
        files.append(str(out / "report.png"))
    else:
        notes.append(why_not)
    chosen = best_of(results, float(meta["slo_p99_ms"]))
    if chosen is not None:
        files.append(str(write_env(out / ENV_FILE, chosen, float(meta["slo_p99_ms"]))))
    else:
        (out / ENV_FILE).unlink(missing_ok=True)  # an old run's choice must not look like this one's
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    files.append(str(out / "results.json"))
    return {**document, "files": files, "notes": notes}
