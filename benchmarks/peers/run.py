"""Re-run the peer benchmark end to end and rewrite its section of docs/benchmarks.md.

    .venv/bin/python -m benchmarks.peers.run            # 3 rounds, c = 1, 8, 32, 64, 10 s a row
    .venv/bin/python -m benchmarks.peers.run --quick    # 1 round, c = 1 and 32, 5 s a row
    .venv/bin/python -m benchmarks.peers.run --gmlp-also "ov=--backend openvino --variant fp32"

It installs each peer into its own venv under .bench-venvs/ (once), exports the demo classifier
if models/ lacks it, and needs wrk (Debian/Ubuntu: apt-get install wrk). Raw results go to
benchmarks/peers/results.json, kept in git beside the section for before/after comparisons; the
section is rewritten from them (`--report-only` redraws it without measuring).

On a small shared machine the background load drifts by tens of percent within minutes, so the
peers are interleaved: each round runs the bare pipeline and raw ORT, then starts, checks and
measures every peer at every concurrency (the order rotating from round to round); the report
takes medians over rounds. A peer's answers are checked against raw ONNX Runtime's before any
timing: a fast wrong server is no result.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import wrk
from benchmarks.harness import REPO, command_line, cpu_facts, replace_section
from benchmarks.peers.model import CPUS, INSTANCES_ENV, VARIANT, PeerModel, instances, intra_op_threads
from benchmarks.peers.peers import (
    PEER_KEYS,
    PEERS,
    Peer,
    classify,
    ensure_venv,
    gmlp_also,
    request_body,
    running,
)
from gmlp.server_process import (
    ServerProcess,
    link_repository,
    machine_busy_seconds,
    reaped_children_cpu_seconds,
    tree_cpu_seconds,
)
from loadtests.workload import BUNDLED_DIR

MODEL = REPO / "models" / "cifar10-gmlp"
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "peers" / "results.json"  # committed with the section it feeds
WARMUP_S = 2.0
# The section of docs/benchmarks.md this program rewrites, and what its table shows.
BEGIN = "<!-- peers:begin (written by benchmarks/peers/run.py) -->"
END = "<!-- peers:end -->"
HEADING = "## Against other servers"
TABLE_LEVELS = (8, 32, 64)
CPU_LEVEL = 32


def spread(values: Iterable[float], digits: int = 0) -> str:
    """The median of a figure over rounds, with its range when there was more than one round ("-"
    where nothing was measured)."""
    vals = [v for v in values if v == v]  # drop NaN
    if (mid := median(vals)) is None:
        return "-"
    return f"{mid:.{digits}f}" + (
        f" ({min(vals):.{digits}f}-{max(vals):.{digits}f})" if len(vals) > 1 else ""
    )


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
    columns = [
        "c=1 p50 ms",
        *(f"c={c} req/s" for c in TABLE_LEVELS),
        f"server CPU ms/request (c={CPU_LEVEL})",
    ]
    columns.append(f"background CPU % (c={CPU_LEVEL})")
    head = "| server | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns) + "\n"
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
            rps = spread(r["requests_per_s"] for r in runs)
            ms = spread((r["cpu_ms_per_request"] for r in runs), 2)
            lines.append(f"| {label} | |{empty} {rps} images/s | | {ms} per image | |")
    return head + "\n".join(lines) + "\n"


def ratios(results: dict[str, Any], labels: dict[str, str], ours: str = "gmlp-serve") -> list[str]:
    """gmlp-serve against the best other server at each level, and against raw ORT."""
    rows = results["rows"]
    others = [k for k in labels if not k.startswith(ours)]
    out = []
    # (clients, figure, which peer is the one to beat, what is compared, whose figure)
    against = [(1, "p50_ms", min, "c=1 p50", "the lowest peer's")]
    against += [(c, "rps", max, f"c={c} req/s", "the best peer's") for c in TABLE_LEVELS]
    per_request = f"c={CPU_LEVEL} server CPU per request"
    against.append((CPU_LEVEL, "cpu_ms_per_request", min, per_request, "the most frugal peer's"))
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


def bundled_images() -> dict[str, bytes]:
    """The bundled CIFAR-10 test JPEGs by name, in order: the first is the one every request sends."""
    return {p.name: p.read_bytes() for p in sorted(BUNDLED_DIR.glob("cifar10-test-*.jpg"))}


def measure_row(
    server: ServerProcess, peer: str, script: Path, rnd: int, c: int, seconds: float
) -> dict[str, Any]:
    """One wrk run against one peer: its rate, latencies, errors and the server's CPU per request,
    and `others_cpu_pct`, the CPU the rest of the machine used meanwhile (not the server, not wrk)
    as a share of all CPUs: the background load that makes a row slow for reasons outside it."""
    before, busy0, wrk0, t0 = (
        tree_cpu_seconds(server.pid),
        machine_busy_seconds(),
        reaped_children_cpu_seconds(),
        time.monotonic(),
    )
    result = wrk.run(server.url, script, c, seconds)
    cpu_s = tree_cpu_seconds(server.pid) - before
    # wrk is the only child that finishes (and is reaped) during the row.
    others = machine_busy_seconds() - busy0 - cpu_s - (reaped_children_cpu_seconds() - wrk0)
    capacity = (time.monotonic() - t0) * (os.cpu_count() or 1)
    return {
        "peer": peer,
        "round": rnd,
        "concurrency": c,
        "rps": result.rps,
        "p50_ms": result.percentiles_ms[50.0],
        "p99_ms": result.percentiles_ms.get(99.0, float("nan")),
        "cpu_ms_per_request": cpu_s * 1000.0 / max(result.requests, 1),
        "requests": result.requests,
        "errors": result.errors,
        "others_cpu_pct": 100.0 * max(others, 0.0) / capacity,
    }


@contextlib.contextmanager
def started(peer: Peer, work: Path) -> Iterator[tuple[ServerProcess, Path]]:
    """`peer` serving the demo classifier, ready at its first answer to the request every row
    sends (the first bundled JPEG), and the wrk script that sends it."""
    image = next(iter(bundled_images().values()))
    body, content_type = request_body(image, peer.body)
    (work / f"{peer.key}.body").write_bytes(body)
    script = work / f"{peer.key}.lua"
    script.write_text(wrk.lua_script(work / f"{peer.key}.body", content_type))
    with running(peer, work, MODEL, lambda s: classify(s.url, image, peer.body, timeout_s=5.0)) as server:
        yield server, script


def bare_pipeline(model_dir: Path, seconds: float) -> dict[str, Any]:
    """One round of the bare /classify pipeline with the peers' settings (instances, threads,
    variant), in its own process so that its CPU is its own."""
    cmd = [
        *(sys.executable, "-m", "benchmarks.bare_pipeline", "--task", "classify"),
        *("--model-dir", str(model_dir), "--seconds", str(seconds), "--rounds", "1", "--variant", VARIANT),
        *("--instances", str(instances()), "--intra-op-threads", str(intra_op_threads())),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bare pipeline run failed: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_peer(peer: Peer, rnd: int, args: argparse.Namespace, work: Path, results: dict[str, Any]) -> None:
    with started(peer, work) as (server, script):
        expected = results["reference"]
        wrong = {
            name: (got, expected[name])
            for name, data in bundled_images().items()
            if (got := classify(server.url, data, peer.body)) != expected[name]
        }
        if wrong:  # a fast wrong server is no result
            raise AssertionError(f"{peer.key} answers differ from raw ORT (got, expected): {wrong}")
        wrk.run(server.url, script, 8, WARMUP_S)  # warm-up, not recorded
        for c in args.levels:
            row = measure_row(server, peer.key, script, rnd, c, args.duration)
            results["rows"].append(row)
            print(
                f"  {peer.key:22s} c={c:<3d} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:7.2f} ms"
                f"  CPU {row['cpu_ms_per_request']:6.2f} ms/req  errors {row['errors']}"
                f"  others {row['others_cpu_pct']:3.0f}%",
                flush=True,
            )


def run_rounds(args: argparse.Namespace, peers: list[Peer], work: Path) -> dict[str, Any]:
    """Every round: the bare pipeline and raw ORT, then each peer (rotated order) at every level.
    The results: a row per wrk run (`measure_row`), the bare /classify pipeline's run per round
    (with raw `session.run` beside it as its "raw"), the peers that failed, and raw ORT's top
    labels (the `reference` answers, not saved)."""
    results: dict[str, Any] = {"rows": [], "bare": [], "failed": {}}
    # Top labels from raw ONNX Runtime with the product's preprocessing: the answers to match.
    model = PeerModel.load(MODEL)
    results["reference"] = {
        name: model.predict([model.transform(data)])[0]["predictions"][0]["label"]
        for name, data in bundled_images().items()
    }
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", flush=True)
        bare = bare_pipeline(MODEL, args.duration)
        results["bare"].append({"round": rnd, **bare["bare"], "raw": bare["raw"]})
        for kind in ("bare", "raw"):
            rate, cpu = bare[kind]["requests_per_s"], bare[kind]["cpu_ms_per_request"]
            print(f"  {kind} b16: {rate:.1f} images/s, {cpu:.2f} CPU ms/image", flush=True)
        for peer in peers[rnd % len(peers) :] + peers[: rnd % len(peers)]:
            if peer.key in results["failed"]:
                continue
            try:
                run_peer(peer, rnd, args, work, results)
            except Exception as exc:  # one broken peer must not lose the others' rows
                results["failed"][peer.key] = f"{type(exc).__name__}: {exc}"
                print(f"  {peer.key} FAILED: {results['failed'][peer.key]}", flush=True)
    return results


def ensure_model() -> None:
    if (MODEL / "model.int8.onnx").exists():
        return
    print(f"exporting the demo classifier into {MODEL}")
    cmd = [sys.executable, "-m", "gmlp", "export", str(REPO / "checkpoints" / "cifar10-gmlp")]
    subprocess.run([*cmd, "--out", str(MODEL), "--variants", "fp32,int8"], check=True)


def section(results: dict[str, Any]) -> str:
    """The markdown between the markers: this run's conditions, table and ratios (what is
    measured and how, and what is not like for like, is prose around them in the document)."""
    meta = results["meta"]
    measured = [*PEERS, *also_rows(meta.get("also", {}))]
    names = {p.key: p.label for p in measured if p.key in meta["peers"]}
    failed = "".join(f"\n- {k}: not measured ({why})" for k, why in results.get("failed", {}).items())
    m = meta["machine"]
    background = spread(r.get("others_cpu_pct", float("nan")) for r in results["rows"])
    load = f"a median {background} % of both CPUs" if background != "-" else "an unmeasured share"
    ratio_lines = "\n".join(f"- {line}" for line in ratios(results, names))
    instances = int(meta.get("instances", 1))
    return f"""\
Measured {meta["date"]} on {m.get("cpu", "?")}, {m.get("cpus", "?")} vCPUs ({m.get("hypervisor")} guest;
SIMD: {m.get("simd", "?")}), Python {m.get("python")}: {instances} execution instance(s) of
{max(1, CPUS // instances)} intra-op thread(s) each, `model.{VARIANT}.onnx`, {meta["duration_s"]:g} s
per row, {meta["rounds"]} round(s) at c = {", ".join(map(str, meta["levels"]))} (about
{meta["minutes"]:.0f} minutes); during the rows the rest of the machine used {load}.

{table(results, names)}
gmlp-serve, medians:
{ratio_lines}{failed}
"""


def also_rows(also: dict[str, str]) -> list[Peer]:
    """The further gmlp-serve rows, by name: their `gmlp serve` flags (`--gmlp-also`)."""
    return [gmlp_also(name, flags) for name, flags in also.items()]


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
    parser.add_argument(
        "--gmlp-also",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="one more gmlp-serve row, gmlp-serve-NAME, with these `gmlp serve` flags after the peers' "
        "layout (repeatable); it is compared with the peers beside gmlp-serve, not counted among them",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="measure only; leave docs/ alone")
    parser.add_argument("--report-only", action="store_true", help="redraw docs from --results")
    args = parser.parse_args()
    if not args.report_only:
        measure(args)
    results = json.loads(args.results.read_text())
    if not args.no_docs:
        DOC.write_text(replace_section(DOC.read_text(), section(results), BEGIN, END, HEADING))
        print(f"wrote {DOC}")


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
    also = dict(spec.split("=", 1) if "=" in spec else (spec, "") for spec in args.gmlp_also)
    try:
        peers = [p for p in PEERS if p.key in keys] + also_rows(also)
    except ValueError as exc:
        raise SystemExit(f"--gmlp-also: {exc}") from None
    ensure_model()
    for peer in peers:
        ensure_venv(peer)
    args.levels = [int(c) for c in args.levels.split(",")]
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="gmlp-peers-") as tmp:
        work = Path(tmp)
        link_repository(work, MODEL)
        results = run_rounds(args, peers, work)
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60.0
    meta = {
        "date": started.strftime("%Y-%m-%d"),
        "machine": cpu_facts(),
        "rounds": args.rounds,
        "levels": args.levels,
        "instances": args.instances,
        "duration_s": args.duration,
        "peers": [p.key for p in peers],
        "also": also,
        "minutes": minutes,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "rows": results["rows"], "bare": results["bare"], "failed": results["failed"]}
    args.results.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
