"""`gmlp tune`'s search against the full grid of the same space, under the same SLO.

    python -m benchmarks.tune_vs_grid --model-repository models --model cifar10-gmlp --slo-p99-ms 50

Runs `gmlp tune` twice with the same knobs, levels, windows and SLO: searching (within
`--budget-minutes`) and `--grid`. The grid's best is the maximum of many noisy measurements, so
the two picks are measured again side by side for `--rounds` rounds and compared by their medians
(throughput at the SLO, and the time each run took). Both runs' reports stay in `--out`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import command_line, cpu_line
from gmlp.tune.command import KNOB_FLAGS
from gmlp.tune.measure import Plan, measure
from gmlp.tune.space import Candidate


def _tune(args: Any, out: Path, *extra: str) -> dict[str, Any]:
    """One `gmlp tune` run; its results.json."""
    knobs = [
        arg
        for knob in KNOB_FLAGS
        if (value := getattr(args, knob)) is not None
        for arg in ("--" + knob.replace("_", "-"), value)
    ]
    cmd = [
        *(sys.executable, "-m", "gmlp", "tune", "--model-repository", str(args.model_repository)),
        *("--model", args.model, "--slo-p99-ms", str(args.slo_p99_ms), "--concurrency", args.concurrency),
        *("--seconds", str(args.seconds), "--warmup", str(args.warmup), "--out", str(out), *knobs, *extra),
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)  # exit 1 (nothing met the SLO) still leaves its results
    return json.loads((out / "results.json").read_text())


def main() -> None:
    p = command_line(__doc__)
    p.add_argument("--model-repository", type=Path, default=Path("models"))
    p.add_argument("--model", required=True)
    p.add_argument("--slo-p99-ms", type=float, required=True)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--budget-minutes", type=float, default=10.0, help="the search's budget")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3, help="side-by-side rounds of the two picks")
    p.add_argument("--out", type=Path, default=Path("reports/tune-vs-grid"))
    for knob, text in KNOB_FLAGS.items():
        p.add_argument("--" + knob.replace("_", "-"), dest=knob, help=text)
    args = p.parse_args()
    search = _tune(args, args.out / "search", "--budget-minutes", str(args.budget_minutes))
    grid = _tune(args, args.out / "grid", "--grid")
    print(cpu_line())
    print(
        f"search: {len(search['candidates'])} candidates in {search['elapsed_s']:.0f} s; "
        f"grid: {len(grid['candidates'])} in {grid['elapsed_s']:.0f} s "
        f"({search['elapsed_s'] / grid['elapsed_s']:.2f}x the grid's time)"
    )
    if search["chosen"] is None or grid["chosen"] is None:
        print(f"no comparison: a run found nothing that met p99 <= {args.slo_p99_ms:g} ms")
        return
    picks = {"search": search["chosen"]["settings"], "grid": grid["chosen"]["settings"]}
    rates: dict[str, list[float]] = {"search": [], "grid": []}
    levels, work = tuple(int(c) for c in args.concurrency.split(",")), args.out / "rounds"
    plan = Plan(args.model_repository, args.model, levels, args.seconds, args.warmup, args.slo_p99_ms, work)
    for r in range(args.rounds):
        for i, (name, settings) in enumerate(picks.items()):
            # Throughput at the SLO of a fresh measurement; a miss counts as nothing served.
            best = measure(plan, Candidate(**settings), 2 * r + i + 1).best_level(args.slo_p99_ms)
            rates[name].append(0.0 if best is None else float(best["rps"]))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, settings in picks.items():
        label = Candidate(**settings).label()
        print(f"{name} pick: {label}: median {medians[name]:.1f} req/s at the SLO over {args.rounds} rounds")
    if medians["grid"] > 0:
        print(f"search's pick / grid's pick: {medians['search'] / medians['grid']:.3f}x the throughput")


if __name__ == "__main__":
    main()
