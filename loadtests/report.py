"""The sweep's outputs: results.json (all figures), report.md (tables), report.png (curves).

results.json is the source of truth: report.md and report.png are rendered from it alone, so a
report can be re-rendered or compared across runs without re-running anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = "gmlp-loadtest-results/1"


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _timing(stats: dict[str, Any]) -> str:
    """The requests, req/s, p50, p95 and p99 cells of a stats row (an endpoint or all together)."""
    cells = [_fmt(stats.get("requests")), _fmt(stats.get("rps"), 1)]
    return " | ".join(cells + [_fmt(stats.get(f"p{q}_ms")) for q in (50, 95, 99)])


def _models_table(models: list[dict[str, Any]]) -> list[str]:
    if not models:
        return ["(GET /models was not available)"]
    lines = [
        "| model | task | variant | rows batched | max batch | queue delay ms | ORT threads | provider |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        b = m.get("batching", {})
        lines.append(
            f"| {m.get('name')} | {m.get('task')} | {m.get('variant')} | {m.get('rows_batched')} | "
            f"{b.get('max_batch_size')} | {b.get('max_queue_delay_ms')} | {m.get('intra_op_threads')} | "
            f"{m.get('provider')} |"
        )
    return lines


def summary_table(steps: list[dict[str, Any]]) -> list[str]:
    """One row per user count, all endpoints together (report.md's summary; `gmlp loadtest` prints it)."""
    lines = [
        "| users | requests | req/s | p50 ms | p95 ms | p99 ms | failures | avg batch size |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        b = s["batch_size_all"]
        batch = (
            "n/a (no /metrics)" if b is None else _fmt(b["mean"], 2) if b["batches"] else "n/a (no batches)"
        )
        lines.append(f"| {s['users']} | {_timing(s['total'] or {})} | {s['failures']} | {batch} |")
    return lines


def _heading(title: str) -> list[str]:
    """A section heading of report.md, with the blank lines around it."""
    return ["", f"## {title}", ""]


def render_markdown(results: dict[str, Any]) -> str:
    """report.md: summary per user count, per endpoint, batch sizes per model, failures."""
    steps = results["steps"]
    w = results["workload"]
    lines = [
        "# Load test report",
        "",
        f"- target: `{results['url']}`",
        f"- run: {results['started']} to {results['finished']}",
        f"- each step: {w.get('duration')} at a fixed number of closed-loop users (spawn rate "
        f"{w.get('spawn_rate') or 'all in 1 s'}), no think time",
        f"- task weights: classify {w.get('classify_weight')}, fill-mask {w.get('fill_mask_weight')}",
        f"- failed requests in all steps: **{results['total_failures']}**",
        *_heading("Served models"),
        *_models_table(results.get("server_models", [])),
        *_heading("Summary (all endpoints)"),
        *summary_table(steps),
        *_heading("Per endpoint"),
        "| users | endpoint | requests | req/s | p50 ms | p95 ms | p99 ms | failures |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        for name, e in sorted(s["endpoints"].items()):
            lines.append(f"| {s['users']} | `{name}` | {_timing(e)} | {e['failures']} |")
    lines += _heading("Batch sizes by model (server side, from the `gmlp_batch_size` histogram)")
    lines += [
        "| users | model | batches | requests in batches | avg batch size |",
        "|---:|---|---:|---:|---:|",
    ]
    for s in steps:
        for model, b in sorted(s["batch_size"].items()):
            lines.append(
                f"| {s['users']} | {model} | {b['batches']:,} | {b['requests']:,} | {_fmt(b['mean'], 2)} |"
            )
    problems = [s for s in steps if s["failures"] or s["error"] or s["rejections"]]
    if problems:
        lines += _heading("Failures and rejections")
        for s in problems:
            lines.append(f"- **users={s['users']}**")
            if s["error"]:
                lines.append(f"  - step error: {s['error'].splitlines()[0]}")
            for f in s["failure_messages"][:10]:
                lines.append(f"  - {f['occurrences']} x {f['method']} `{f['name']}`: {f['error']}")
            for key, count in sorted(s["rejections"].items()):
                lines.append(f"  - rejected by the batcher: {count} x {key}")
    lines += _heading("Files")
    lines.append("- `results.json`: every figure above; `report.png`: throughput and p95 latency vs users")
    for s in steps:
        files = ", ".join(f"[{name}]({path})" for name, path in s["files"].items())
        lines.append(f"- users={s['users']}: {files}")
    lines += [
        "",
        "Columns: *req/s* = completed requests per second over the step (failures included); "
        "*p50/p95/p99* = response-time percentiles in ms as locust measures them (client side, "
        "including queueing in the server); *failures* = non-200 answers, connection errors and "
        "200s whose body failed the schema check; *avg batch size* = requests per model run during "
        "the step (delta of the histogram's sum / count). See docs/loadtesting.md.",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """report.png: throughput and p95 vs users (per endpoint and total), and p95 vs throughput."""
    import matplotlib

    matplotlib.use("Agg")  # no display in CI or a container
    import matplotlib.pyplot as plt

    steps = [s for s in results["steps"] if s["total"]]
    users = [s["users"] for s in steps]
    fig, (ax_rps, ax_p95, ax_curve) = plt.subplots(1, 3, figsize=(15, 4.5))
    series = [("all", [s["total"] for s in steps])]
    names = sorted({name for s in steps for name in s["endpoints"]})
    series += [(name, [s["endpoints"].get(name) for s in steps]) for name in names]
    for label, rows in series:
        style = {"linewidth": 2.5, "marker": "o"} if label == "all" else {"linestyle": "--", "marker": "."}
        xs = [u for u, r in zip(users, rows, strict=True) if r]
        ax_rps.plot(xs, [r["rps"] for r in rows if r], label=label, **style)
        p95 = [(u, r["p95_ms"]) for u, r in zip(users, rows, strict=True) if r and r["p95_ms"] is not None]
        ax_p95.plot([u for u, _ in p95], [v for _, v in p95], label=label, **style)
    totals = [(s["users"], s["total"]["rps"], s["total"]["p95_ms"]) for s in steps if s["total"]["p95_ms"]]
    ax_curve.plot([t[1] for t in totals], [t[2] for t in totals], marker="o", linewidth=2)
    for u, rps, p95 in totals:
        label = f"{u} user{'s' if u != 1 else ''}"
        ax_curve.annotate(label, (rps, p95), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for ax, title, ylabel in (
        (ax_rps, "Throughput vs users", "requests/s"),
        (ax_p95, "p95 latency vs users", "p95 latency (ms)"),
    ):
        ax.set(title=title, xlabel="concurrent users", ylabel=ylabel)
        if len(users) > 1 and max(users) / min(users) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(users, [str(u) for u in users])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_curve.set(
        title="p95 latency vs throughput (all endpoints)", xlabel="requests/s", ylabel="p95 latency (ms)"
    )
    ax_curve.grid(True, alpha=0.3)
    fig.suptitle(f"gmlp load test: {results['url']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, report.md and report.png into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "md": out_dir / "report.md", "png": out_dir / "report.png"}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(results), encoding="utf-8")
    plot(results, paths["png"])
    return paths
