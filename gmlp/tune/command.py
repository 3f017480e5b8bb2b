"""`gmlp tune`: find the serving settings with the highest throughput under a p99 latency SLO on
this machine, by starting the real server with candidate settings and loading it.

Only argparse at import time (`gmlp --help` imports this module in every image); the handler
imports the service's settings and the measurement code.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

KNOB_FLAGS = {
    "variant": "variants to try (default: fp32 and int8, those the model has)",
    "instances": "execution instances to try (default: 1, 2, 4, ... up to the CPUs)",
    "intra_op_threads": "intra-op threads per instance to try (default: 1, 2, 4, ... up to the CPUs)",
    "max_batch_size": "largest batch sizes to try (default: 4,8,16,32)",
    "max_queue_delay_ms": "queue delays to try, ms (default: 0,2,5)",
    "queue_delay_policy": "queue delay policies to try (default: arriving,always)",
}
DEFAULT_VALUES = {
    "max_batch_size": "4,8,16,32",
    "max_queue_delay_ms": "0,2,5",
    "queue_delay_policy": "arriving,always",
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
        description="Start `gmlp serve` with candidate settings (variant, instances, intra-op threads, "
        "max batch size, queue delay and policy), load each with a closed-loop client at every --concurrency "
        "level, and search by coordinate descent within --budget-minutes (--grid: every combination). "
        "Writes OUT/tuned.env (GMLP_* lines of the best candidate whose p99 met the SLO with no failed "
        "request), OUT/report.md, OUT/results.json and OUT/report.png (with matplotlib). Exits 1 when no "
        "candidate met the SLO.",
    )
    for flag, kind, default, text in _OPTIONS:
        p.add_argument(flag, type=kind, default=default, required=flag == "--slo-p99-ms", help=text)
    p.add_argument(
        "--grid", action="store_true", help="measure every combination (to compare with the search)"
    )
    for knob, text in KNOB_FLAGS.items():
        p.add_argument("--" + knob.replace("_", "-"), dest=f"knob_{knob}", default=None, help=text)
    p.set_defaults(handler=run_tune)


def _model_and_variants(repository: Path, model: str | None) -> tuple[str, list[str]]:
    """The model to tune and the variants its newest complete version has."""
    from contract.errors import UserError
    from contract.scan import require_sources

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
    return model, sorted(spec.variants)


def _space(args: argparse.Namespace, variants: list[str], cpus: int) -> Any:
    from contract.errors import UserError
    from gmlp.tune.space import KNOBS, Space, parse_values, power_of_two_steps

    steps = ",".join(map(str, power_of_two_steps(cpus)))
    defaults = {
        **DEFAULT_VALUES,
        "variant": ",".join(v for v in ("int8", "fp32") if v in variants) or ",".join(variants),
        "instances": steps,
        "intra_op_threads": steps,
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
    from gmlp.tune.report import write_all
    from gmlp.tune.space import Candidate, Measured, coordinate_descent, full_grid
    from loadtests.runner import parse_users
    from service.settings import ServiceSettings, available_cpus

    if args.slo_p99_ms <= 0 or args.seconds <= 0 or args.warmup < 0:
        raise UserError("--slo-p99-ms and --seconds must be > 0, --warmup >= 0")
    model, variants = _model_and_variants(args.model_repository, args.model)
    cpus = args.cpus or available_cpus()
    space = _space(args, variants, cpus)
    defaults = ServiceSettings(cpus=cpus)
    instances = defaults.resolved_instances("cpu")
    start = Candidate(
        variant=space.values["variant"][0],
        instances=instances,
        intra_op_threads=defaults.resolved_threads(instances),
        max_batch_size=defaults.max_batch_size,
        max_queue_delay_ms=defaults.max_queue_delay_ms,
        queue_delay_policy=defaults.queue_delay_policy,
    )
    budget_min = args.budget_minutes if args.budget_minutes is not None else (None if args.grid else 10.0)
    try:
        concurrency = tuple(parse_users(args.concurrency))
    except UserError as exc:  # its message names the load test's --users
        raise UserError(str(exc).replace("--users", "--concurrency")) from None
    serve_args = (*shlex.split(args.serve_args), *(("--cpus", str(args.cpus)) if args.cpus else ()))
    results: list[Measured] = []
    stopped: list[str] = []
    began = time.monotonic()
    plan = Plan(
        repository=args.model_repository,
        model=model,
        concurrency=concurrency,
        seconds=args.seconds,
        warmup_s=args.warmup,
        slo_p99_ms=args.slo_p99_ms,
        work_dir=args.out / "logs",  # each candidate's server log, for a candidate that failed
        serve_args=serve_args,
    )

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

    if args.grid:
        walk = full_grid(space, start, guarded)
    else:
        walk = coordinate_descent(space, start, guarded, args.slo_p99_ms)
    for _ in walk:
        pass
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
    for note in document["notes"]:
        print(f"gmlp tune: {note}", file=sys.stderr)
    print("wrote " + ", ".join(document["files"]))
    if document["chosen"] is None:
        print(f"gmlp tune: no candidate met p99 <= {args.slo_p99_ms:g} ms (see the report)", file=sys.stderr)
        return 1
    print(f"chosen: {document['chosen']['label']}")
    return 0


def _print_progress(index: int, measured: Any, slo: float) -> None:
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
