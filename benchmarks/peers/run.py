"""Re-run the peer benchmark end to end and rewrite its section of docs/benchmarks.md.

    .venv/bin/python -m benchmarks.peers.run            # 3 rounds, c = 1, 8, 32, 64, 10 s a row
    .venv/bin/python -m benchmarks.peers.run --quick    # 1 round, c = 1 and 32, 5 s a row

It installs each peer into its own venv under .bench-venvs/ (once), exports the demo classifier
if models/ lacks it, and needs wrk (Debian/Ubuntu: apt-get install wrk). Raw results go to
benchmarks/peers/results.json, kept in git beside the section for before/after comparisons; the
section and plot are rewritten from them (`--report-only` redraws them without measuring).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, command_line, cpu_facts
from benchmarks.peers import report
from benchmarks.peers.bench import Plan, run_rounds
from benchmarks.peers.model import CPUS, INSTANCES_ENV, VARIANT
from benchmarks.peers.peers import PEER_KEYS, PEERS, ensure_venv
from gmlp.server_process import link_repository

MODEL = REPO / "models" / "cifar10-gmlp"
DOC = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "img" / "peers-throughput-latency.png"
RESULTS = REPO / "benchmarks" / "peers" / "results.json"  # committed with the section it feeds


def ensure_model() -> None:
    if (MODEL / "model.int8.onnx").exists():
        return
    print(f"exporting the demo classifier into {MODEL}")
    cmd = [sys.executable, "-m", "gmlp", "export", str(REPO / "checkpoints" / "cifar10-gmlp")]
    subprocess.run([*cmd, "--out", str(MODEL), "--variants", "fp32,int8"], check=True)


def labels(keys: list[str]) -> dict[str, str]:
    return {p.key: p.label for p in PEERS if p.key in keys}


def section(results: dict[str, Any]) -> str:
    """The markdown between the markers: this run's conditions, table, ratios and plot (what is
    measured and how, and what is not like for like, is prose around them in the document)."""
    meta, keys = results["meta"], [k for k in PEER_KEYS if k in results["meta"]["peers"]]
    names = labels(keys)
    failed = "".join(f"\n- {k}: not measured ({why})" for k, why in results.get("failed", {}).items())
    m = meta["machine"]
    background = report.stat(r.get("others_cpu_pct", float("nan")) for r in results["rows"])
    load = f"a median {background.fmt()} % of both CPUs" if background else "an unmeasured share"
    ratio_lines = "\n".join(f"- {line}" for line in report.ratios(results, names))
    instances = int(meta.get("instances", 1))
    return f"""\
Measured {meta["date"]} on {m.get("cpu", "?")}, {m.get("cpus", "?")} vCPUs ({m.get("hypervisor")} guest;
SIMD: {m.get("simd", "?")}), Python {m.get("python")}: {instances} execution instance(s) of
{max(1, CPUS // instances)} intra-op thread(s) each, `model.{VARIANT}.onnx`, {meta["duration_s"]:g} s
per row, {meta["rounds"]} round(s) at c = {", ".join(map(str, meta["levels"]))} (about
{meta["minutes"]:.0f} minutes); during the rows the rest of the machine used {load}.

{report.table(results, names)}
gmlp-serve, medians:
{ratio_lines}

![throughput against latency](img/{PLOT.name}){failed}
"""


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round, c = 1 and 32, 5 s rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk row")
    parser.add_argument(
        "--instances",
        type=int,
        default=2,
        help="execution instances of every server (batches that may run at once), each with "
        f"{CPUS} / N ORT threads; raw ORT runs as many threads (default 2: gmlp-serve's default here)",
    )
    parser.add_argument("--peers", default=",".join(PEER_KEYS), help=f"subset of {','.join(PEER_KEYS)}")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="measure only; leave docs/ alone")
    parser.add_argument("--report-only", action="store_true", help="redraw docs from --results")
    args = parser.parse_args()
    if not args.report_only:
        measure(args)
    results = json.loads(args.results.read_text())
    if not args.no_docs:
        names = labels(results["meta"]["peers"])
        report.plot(results, names, PLOT)
        DOC.write_text(report.replace_section(DOC.read_text(), section(results)))
        print(f"wrote {DOC} and {PLOT}")


def measure(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian/Ubuntu: apt-get install -y wrk)")
    if args.quick:
        args.rounds, args.levels, args.duration = 1, "1,32", 5.0
    # Read by every server and by raw ORT (child processes inherit it), and by gmlp-serve's flags.
    os.environ[INSTANCES_ENV] = str(args.instances)
    keys = [k.strip() for k in args.peers.split(",") if k.strip()]
    unknown = set(keys) - set(PEER_KEYS)
    if unknown:
        raise SystemExit(f"unknown peers {sorted(unknown)}; known: {', '.join(PEER_KEYS)}")
    peers = [p for p in PEERS if p.key in keys]
    ensure_model()
    for peer in peers:
        ensure_venv(peer)
    plan = Plan(peers, [int(c) for c in args.levels.split(",")], args.rounds, args.duration, args.duration)
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="gmlp-peers-") as tmp:
        work = Path(tmp)
        link_repository(work, MODEL)
        results = run_rounds(plan, work, MODEL, log=functools.partial(print, flush=True))
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60.0
    meta = {
        "date": started.strftime("%Y-%m-%d"),
        "machine": cpu_facts(),
        "rounds": plan.rounds,
        "levels": plan.levels,
        "instances": args.instances,
        "duration_s": plan.duration_s,
        "peers": keys,
        "minutes": minutes,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"meta": meta, **results.to_json()}, indent=1))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
