"""`gmlp tune`: find the serving settings with the highest throughput under a p99 latency SLO on
this machine, by starting the real server with candidate settings and loading it.

Only argparse and the search space at import time (`gmlp --help` imports this module in every
image); the handler imports the service's settings and the measurement code.

What it writes: the chosen settings as an env file, and a report of every candidate (results.json,
report.md, and report.png when matplotlib is installed). The env file holds `GMLP_*` lines only
(comments above them say what was measured), so it can be given to `docker run --env-file`, a
Kubernetes ConfigMap or `set -a; . tuned.env` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gmlp.tune.space import Measured, best_of, meets

KNOB_FLAGS = {
    "variant": "variants to try (default: fp32 and int8, those the model has)",
    "workers": "worker processes to try (default: 1, 2, 4, ... up to the CPUs)",
    "instances": "execution instances to try (default: 1, 2, 4, ... up to the CPUs)",
    "intra_op_threads": "intra-op threads per instance to try (default: 1, 2, 4, ... up to the CPUs)",
    "max_batch_size": "largest batch sizes to try (default: 4,8,16,32)",
    "max_queue_delay_ms": "queue delays to try, ms (default: 0,2,5)",
    "queue_delay_policy": "queue delay policies to try (default: arriving,always)",
    "backend": "backends to try (default: onnxruntime, and what `--backend auto` picks on this CPU)",
    "lone_threads": "threads of a lone request to try, 0 for its instance's (default: 0 and the CPUs)",
}

# (flag, type, default, help) of the options that take a value.
_OPTIONS = (
    ("--model-repository", Path, Path("models"), "model repository (default models)"),
    ("--model", str, None, "the model to tune (default: the repository's only model)"),
    ("--slo-p99-ms", float, None, "p99 latency the settings must meet, ms"),
    ("--concurrency", str, "1,8,32", "concurrent clients, one level each (default 1,8,32)"),
    ("--budget-minutes", float, None, "time for the search (default 10; --grid: none)"),
    ("--seconds", float, 5.0, "measured window per level, s (default 5)"),
    ("--warmup", float, 1.0, "unrecorded load before each window, s (default 1)"),
    ("--cpus", int, None, "CPUs the server may use (default: those available)"),
    ("--serve-args", str, "", "more `gmlp serve` flags for every candidate, one string"),
    ("--out", Path, Path("tune-report"), "output directory (default tune-report)"),
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `tune` to the `gmlp` console script (gmlp/cli.py)."""
    p = sub.add_parser(
        "tune",
        help="search the serving settings with the best throughput under a p99 SLO; write an env file",
        description="Start `gmlp serve` with candidate settings (variant, workers, instances, intra-op "
        "threads, max batch size, queue delay and policy, backend, a lone request's threads), load each "
        "with a closed-loop client at every --concurrency level, and search by coordinate descent within "
        "--budget-minutes (--grid: every combination). Writes OUT/tuned.env (GMLP_* lines of the best "
        "candidate whose p99 met the SLO with no failed request), OUT/report.md, OUT/results.json and "
        "OUT/report.png (with matplotlib). Exits 1 when no candidate met the SLO.",
    )
    for flag, kind, default, text in _OPTIONS:
        p.add_argument(flag, type=kind, default=default, required=flag == "--slo-p99-ms", help=text)
    p.add_argument(
        "--grid", action="store_true", help="measure every combination (to compare with the search)"
    )
    for knob, text in KNOB_FLAGS.items():
        p.add_argument("--" + knob.replace("_", "-"), dest=f"knob_{knob}", help=text)
    p.set_defaults(handler=run_tune)


def _model_and_variants(repository: Path, model: str | None) -> tuple[str, list[str], int | None]:
    """The model to tune, the variants its newest complete version has and the multiply-adds of
    one of its blocks (what the service's rule for a lone request's threads reads)."""
    from contract.errors import UserError
    from contract.scan import require_sources
    from contract.work import block_macs

    sources = require_sources(repository)
    names = sorted(name for name, source in sources.items() if source.complete_versions())
    if model is None:
        if len(names) != 1:
            raise UserError(f"{repository} serves {', '.join(names)}: name one with --model")
        model = names[0]
    if model not in names:
        raise UserError(f"{repository} has no servable model {model!r} (it has {', '.join(names)})")
    source = sources[model]
    spec = source.versions[source.complete_versions()[-1]].spec
    assert spec is not None  # a complete version has one
    return model, sorted(spec.variants), block_macs(spec.model_config)


def _space(args: argparse.Namespace, variants: list[str], cpus: int) -> Any:
    from contract.errors import UserError
    from gmlp.tune.space import KNOBS, Space, parse_values, power_of_two_steps
    from service.engine.backends import resolve_backend

    steps = ",".join(map(str, power_of_two_steps(cpus)))
    defaults = {  # as KNOB_FLAGS's help says
        "max_batch_size": "4,8,16,32",
        "max_queue_delay_ms": "0,2,5",
        "queue_delay_policy": "arriving,always",
        "variant": ",".join(v for v in ("int8", "fp32") if v in variants) or ",".join(variants),
        "workers": steps,
        "instances": steps,
        "intra_op_threads": steps,
        "backend": ",".join(dict.fromkeys(("onnxruntime", resolve_backend("auto", "cpu")))),
        "lone_threads": f"0,{cpus}",
    }
    values = {k: parse_values(k, getattr(args, f"knob_{k}") or defaults[k]) for k in KNOBS}
    unknown = set(values["variant"]) - set(variants)
    if unknown:
        raise UserError(
            f"--variant: the model has no {', '.join(sorted(unknown))} (it has {', '.join(variants)})"
        )
    return Space(values, cpus)


def run_tune(args: argparse.Namespace) -> int:
    """Handler of `gmlp tune`: search (or grid), write the report and the env file."""
    from contract.errors import UserError
    from gmlp.tune.measure import Plan, measure
    from gmlp.tune.space import KNOBS, Candidate, coordinate_descent, full_grid
    from loadtests.runner import parse_users
    from service.settings import ServiceSettings, available_cpus

    if args.slo_p99_ms <= 0 or args.seconds <= 0 or args.warmup < 0:
        raise UserError("--slo-p99-ms and --seconds must be > 0, --warmup >= 0")
    model, variants, block = _model_and_variants(args.model_repository, args.model)
    cpus = args.cpus or available_cpus()
    space = _space(args, variants, cpus)
    defaults = ServiceSettings(cpus=cpus)
    instances = defaults.resolved_instances("cpu")
    # The service's defaults start the search (with the first variant and backend given), except
    # where the knobs given leave them out.
    served: dict[str, Any] = defaults.model_dump() | {
        "variant": None,
        "backend": None,
        "instances": instances,
        "intra_op_threads": defaults.resolved_threads(instances),
        "lone_threads": defaults.lone_threads_for("cpu", block),
    }
    start = Candidate(**{k: served[k] if served[k] in space.values[k] else space.values[k][0] for k in KNOBS})
    budget_min = args.budget_minutes if args.budget_minutes is not None else (None if args.grid else 10.0)
    concurrency = tuple(parse_users(args.concurrency, "--concurrency"))
    extra = (*shlex.split(args.serve_args), *(("--cpus", str(args.cpus)) if args.cpus else ()))
    logs = args.out / "logs"  # each candidate's server log, for a candidate that failed
    plan = Plan(
        args.model_repository, model, concurrency, args.seconds, args.warmup, args.slo_p99_ms, logs, extra
    )
    results: list[Measured] = []
    stopped: list[str] = []
    began = time.monotonic()

    def guarded(candidate: Candidate) -> Measured | None:
        """Measure unless a candidate of the average cost so far would overrun the budget."""
        if budget_min is not None and results:
            typical = statistics.mean(m.seconds for m in results)
            if time.monotonic() - began + typical > 60 * budget_min:
                stopped.append(f"the {budget_min:g}-minute budget would be exceeded")
                return None
        measured = measure(plan, candidate, len(results) + 1)
        results.append(measured)
        _print_progress(len(results), measured, args.slo_p99_ms)
        return measured

    # Each walk measures through `guarded`, which keeps every result.
    list(
        full_grid(space, start, guarded)
        if args.grid
        else coordinate_descent(space, start, guarded, args.slo_p99_ms)
    )
    meta = {
        "model": model,
        "mode": "grid" if args.grid else "coordinate descent",
        "slo_p99_ms": args.slo_p99_ms,
        "concurrency": list(concurrency),
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "budget_minutes": budget_min,
        "elapsed_s": round(time.monotonic() - began, 1),
        "stopped": stopped[0] if stopped else None,
        "grid_size": len(space.grid()),
        "machine": f"{platform.machine()}, {cpus} of {os.cpu_count()} CPUs usable, "
        f"Python {platform.python_version()}",
    }
    document = write_all(args.out, results, meta)
    print("wrote " + ", ".join(document["files"]))
    if document["chosen"] is None:
        print(f"gmlp tune: no candidate met p99 <= {args.slo_p99_ms:g} ms (see the report)", file=sys.stderr)
        return 1
    print(f"chosen: {document['chosen']['label']}")
    return 0


def _print_progress(index: int, measured: Measured, slo: float) -> None:
    if measured.error:
        print(f"[{index}] {measured.candidate.label()}: failed: {measured.error.splitlines()[0][:200]}")
        return
    levels = "; ".join(
        f"c={lv['concurrency']} {lv['rps']:.0f} req/s p99 {lv['p99_ms']} ms" for lv in measured.levels
    )
    best = measured.best_level(slo)
    verdict = f"meets the SLO at {best['rps']:.0f} req/s" if best else "misses the SLO"
    print(
        f"[{index}] {measured.candidate.label()} ({measured.seconds:.0f} s): {levels}: {verdict}", flush=True
    )


ENV_FILE = "tuned.env"


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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


def write_markdown(path: Path, document: dict[str, Any]) -> None:
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


def write_plot(path: Path, document: dict[str, Any]) -> bool:
    """Throughput against p99, one point per candidate and level; whether matplotlib could draw it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "gmlp tune: matplotlib is not installed (pip install 'gmlp-serve[loadtest]'): no plot",
            file=sys.stderr,
        )
        return False
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
    ax.set(xlabel="p99 latency (ms, log scale)", ylabel="requests per second")
    ax.set_title(f"gmlp tune: {document['model']}, one line per candidate (points: concurrency levels)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_all(out: Path, results: Sequence[Measured], meta: dict[str, Any]) -> dict[str, Any]:
    """results.json, report.md, report.png (if it can) and tuned.env (if a candidate met the SLO);
    returns the results document, with `files` (what was written) added."""
    out.mkdir(parents=True, exist_ok=True)
    slo = float(meta["slo_p99_ms"])
    chosen = best_of(results, slo)
    # Everything measured, as JSON (the report and the benchmark read it).
    document = {
        **meta,
        "chosen": None if chosen is None else _entry(chosen, slo),
        "candidates": [_entry(m, slo) for m in results],
    }
    write_markdown(out / "report.md", document)
    files = [str(out / "report.md")]
    if write_plot(out / "report.png", document):
        files.append(str(out / "report.png"))
    env = out / ENV_FILE
    if chosen is None:
        env.unlink(missing_ok=True)  # an old run's choice must not look like this one's
    else:
        best = document["chosen"]["best_level"]
        lines = [
            f"# gmlp tune: the highest throughput measured with p99 <= {slo:g} ms and no failed request",
            f"# {best['rps']:.1f} req/s, p50 {best['p50_ms']:.1f} ms, p99 {best['p99_ms']:.1f} ms "
            f"at {best['concurrency']} concurrent clients ({chosen.candidate.label()})",
            *chosen.candidate.env_lines(),
        ]
        env.write_text("\n".join(lines) + "\n")
        files.append(str(env))
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    files.append(str(out / "results.json"))
    return {**document, "files": files}
