"""perf_analyzer against gmlp-serve: both demo models, over REST and gRPC, closed and open loop.

    python -m benchmarks.perf_analyzer --models models     # after `make demo-models`

It installs perf_analyzer 2.60 (`benchmarks.perf_analyzer_install`), starts one `gmlp serve` with
gRPC on the repository and runs, for every model, transport and data set, the closed loop at each
of `--concurrency` clients and the Poisson open loop (`--async`) at each of `--rate-fractions` of
the best closed-loop throughput. Each data set is an `--input-data` file of the inputs the model
configuration lists: `random` (pixels from a normal distribution, token ids from the vocabulary:
perf_analyzer's own generator draws ids outside it, and bytes rather than pixel values) or `real`
(the bundled CIFAR-10 JPEGs and Gutenberg sentences through the model's own transform and
tokenizer). The table replaces the "perf_analyzer" section of docs/benchmarks.md unless
`--no-doc`; every run's output and CSV stay in `--out`.

`--against pytriton` measures NVIDIA PyTriton (`benchmarks/peers/pytriton_server.py`, its own venv)
on the classifier beside gmlp-serve, both with the peer benchmark's layout (`--instances`, max batch
16, 2 ms delay, the int8 file), in `--rounds` rounds that alternate which server goes first; every
figure is the median over the rounds, Poisson rates are each server's own fraction, and the table
(with gmlp-serve / PyTriton ratios) replaces the "Against PyTriton" section instead.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, command_line, cpu_line, replace_section
from benchmarks.peers.model import INSTANCES_ENV
from benchmarks.peers.peers import Peer, ensure_venv, gmlp_layout, running
from benchmarks.perf_analyzer_install import VERSION, perf_analyzer_command
from contract.image import ImageTransform
from contract.spec import read_spec
from contract.text import FillMaskCodec
from gmlp.server_process import ServerProcess, free_port, get_json, gmlp_serve, http_get, tree_cpu_seconds
from loadtests.runner import parse_users
from loadtests.workload import BUNDLED_DIR, BUNDLED_SENTENCES, read_sentences_tsv

DOC = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- perf_analyzer:begin (written by benchmarks/perf_analyzer.py) -->"
END = "<!-- perf_analyzer:end -->"
HEADING = "## perf_analyzer (`benchmarks.perf_analyzer`)"
# The PyTriton comparison's section; PyTriton 0.7.0 requires numpy < 2, so its venv keeps numpy 1.
AGAINST = ("<!-- pytriton:begin -->", "<!-- pytriton:end -->", "## Against PyTriton")
GMLP, PYTRITON = "gmlp-serve", "pytriton"
# The benchmark's own token for Triton's statistics API, which PyTriton restricts (not a secret: it
# guards only the benchmark's server); Triton reads it from a header over HTTP, metadata over gRPC.
TOKEN = "gmlp_benchmark_triton_access_token"
TOKEN_KEYS = {"http": "triton-access-token", "grpc": "triton-grpc-protocol-triton-access-token"}
RANDOM_ROWS, RANDOM_TOKENS = 16, 32
POISSON_FLAGS = ("--request-distribution", "poisson", "--async")


def parser() -> argparse.ArgumentParser:
    """The command line; the measurement window's flags are perf_analyzer's own."""
    parser = command_line(__doc__)
    parser.add_argument("--models", type=Path, default=REPO / "models", help="model repository")
    parser.add_argument("--concurrency", type=parse_users, default=[1, 8, 32], help="closed-loop clients")
    parser.add_argument("--transports", default="http,grpc", help="of http, grpc")
    parser.add_argument("--measurement-ms", type=int, default=5000, help="measurement window")
    parser.add_argument("--max-trials", type=int, default=6, help="windows until stable, 3 or more")
    parser.add_argument("--stability", type=int, default=10, help="perf_analyzer's --stability-percentage")
    parser.add_argument("--rate-fractions", default="0.5,0.9", help="Poisson rates, of the best closed loop")
    parser.add_argument("--data", default="random,real", help="data sets")
    parser.add_argument("--serve-args", default="", help="extra `gmlp serve` flags, space separated")
    parser.add_argument("--against", choices=[PYTRITON], help="measure this peer beside gmlp-serve")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per median")
    parser.add_argument("--instances", type=int, default=2, help="with --against: both servers' instances")
    parser.add_argument("--classifier", default="cifar10-gmlp", help="with --against: the model both serve")
    parser.add_argument(
        "--also", default="", help="with --against: one more gmlp-serve a round, the layout plus these flags"
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "perf_analyzer", help="raw outputs")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    return parser


def window_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """perf_analyzer's measurement-window flags from the options (checked)."""
    if args.max_trials < 3:
        parser.error("--max-trials must be 3 or more: perf_analyzer compares the last three windows")
    bad = set(args.transports.split(",")) - {"http", "grpc"}
    if bad:
        parser.error(f"unknown transports {sorted(bad)}: http and grpc are measured")
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    return [
        *("--measurement-interval", str(args.measurement_ms), "--max-trials", str(args.max_trials)),
        *("--stability-percentage", str(args.stability)),
    ]


def _row(**arrays: np.ndarray) -> dict[str, Any]:
    """One row of an --input-data document: each input's values and shape."""
    return {name: {"content": a.ravel().tolist(), "shape": list(a.shape)} for name, a in arrays.items()}


def input_data(model_dir: Path, config: dict[str, Any], kind: str) -> dict[str, Any]:
    """perf_analyzer's --input-data document for `kind` (random or real) of the required inputs."""
    spec = read_spec(model_dir)
    assert spec is not None, f"{model_dir} is not a served model"
    rng = np.random.default_rng(0)
    required = sorted(t["name"] for t in config["input"] if not t.get("optional", False))
    if required == ["pixel_values"]:
        if kind == "random":
            dims = [int(d) for d in config["input"][0]["dims"]]
            pixels = [rng.standard_normal(dims).astype(np.float32) for _ in range(RANDOM_ROWS)]
        else:
            transform = ImageTransform.for_model(spec.config, 10**8)
            pixels = [transform(p.read_bytes()) for p in sorted(BUNDLED_DIR.glob("*.jpg"))]
        return {"data": [_row(pixel_values=p) for p in pixels]}
    if required == ["input_ids", "mask_positions"]:
        codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config, model_name=spec.name)
        if kind == "random":
            length = min(RANDOM_TOKENS, codec.n)
            texts = [
                (rng.integers(0, codec.vocab_size, length), rng.integers(0, length, 1))
                for _ in range(RANDOM_ROWS)
            ]
        else:
            encoded = [codec.encode(s.text) for s in read_sentences_tsv(BUNDLED_SENTENCES)]
            texts = [(np.asarray(e.ids), np.asarray(e.mask_positions)) for e in encoded]
        rows = [_row(input_ids=ids.astype(np.int64), mask_positions=at.astype(np.int64)) for ids, at in texts]
        return {"data": rows}
    raise SystemExit(f"model {config['name']}: no data for the required inputs {required}")


def inference_count(server: ServerProcess, model: str, token: str | None) -> int:
    """Inferences the server's statistics extension has counted for `model` so far."""
    headers = {TOKEN_KEYS["http"]: token} if token else None
    stats = get_json(f"{server.base_url}/v2/models/{model}/stats", 10, headers)["model_stats"]
    return sum(int(s["inference_count"]) for s in stats)


def measured(
    command: Sequence[str],
    flags: Sequence[str],
    stem: Path,
    server: ServerProcess,
    model: str,
    token: str | None = None,
) -> tuple[dict[str, str], float | None]:
    """One perf_analyzer run, its output and CSV kept beside `stem`: the measured row of the CSV
    (empty when it measured nothing) and the server's CPU ms per inference over the run. That is
    user + system time of the server's process tree (/proc) over the inferences its statistics
    extension counted meanwhile, warm-up and unstable windows included, which perf_analyzer's own
    figures leave out."""
    cpu0, count0 = tree_cpu_seconds(server.pid), inference_count(server, model, token)
    csv_path = stem.with_suffix(".csv")
    done = subprocess.run(
        [*command, *flags, "-f", str(csv_path)], capture_output=True, text=True, timeout=600
    )
    stem.with_suffix(".txt").write_text(
        " ".join(["perf_analyzer", *flags]) + "\n\n" + done.stdout + done.stderr
    )
    if not csv_path.exists():
        print(f"perf_analyzer failed ({stem}):\n{(done.stdout + done.stderr)[-2000:]}", file=sys.stderr)
        return {}, None
    with csv_path.open() as f:
        row = next(csv.DictReader(f), {})
    cpu1, count1 = tree_cpu_seconds(server.pid), inference_count(server, model, token)
    return row, 1000 * (cpu1 - cpu0) / (count1 - count0) if count1 > count0 else None


# One measured figure set: the server, model, transport, data set and load it was measured at.
Key = tuple[str, str, str, str, str]
FIGURES = ("infer/s", "p50 ms", "p99 ms", "queue ms", "server ms", "server CPU ms/inference", "rate")


def figures(row: dict[str, str], cpu_ms: float | None) -> dict[str, float]:
    """The table's figures of one perf_analyzer CSV row (its latencies are in microseconds)."""

    def us(key: str) -> float:
        return float(row.get(key) or 0.0)

    server = us("Server Queue") + us("Server Compute Input") + us("Server Compute Infer")
    out = {
        "infer/s": float(row["Inferences/Second"]),
        "p50 ms": us("p50 latency") / 1000,
        "p99 ms": us("p99 latency") / 1000,
        "queue ms": us("Server Queue") / 1000,
        "server ms": server / 1000,
        "rate": float(row.get("Request Rate") or 0.0),
    }
    return out if cpu_ms is None else {**out, "server CPU ms/inference": cpu_ms}


def table(results: dict[Key, list[dict[str, float]]]) -> str:
    """The markdown table: per key, the median of each figure over its rounds (blank when none ran),
    then for each key PyTriton also ran, gmlp-serve's infer/s and p99 over PyTriton's."""
    digits = {"infer/s": 0, "p50 ms": 1, "p99 ms": 1, "rate": 0}
    lines = ["| server | model | transport | data | load | " + " | ".join(FIGURES[:-1]) + " |"]
    lines.append("|---" * (5 + len(FIGURES) - 1) + "|")
    medians: dict[Key, dict[str, float]] = {}
    for key, rounds in results.items():
        medians[key] = {
            f: statistics.median(r[f] for r in rounds if f in r)
            for f in FIGURES
            if any(f in r for r in rounds)
        }
        load = key[4] + (f" ({medians[key]['rate']:.0f}/s)" if medians[key].get("rate") else "")
        cells = [f"{medians[key][f]:.{digits.get(f, 2)}f}" if f in medians[key] else "" for f in FIGURES[:-1]]
        lines.append("| " + " | ".join([*key[:4], load, *cells]) + " |")
    pairs = [(k, (PYTRITON, *k[1:])) for k in medians if k[0] == GMLP and (PYTRITON, *k[1:]) in medians]
    if pairs:
        lines += ["", "| model | transport | data | load | infer/s ratio | p99 ratio |", "|---" * 6 + "|"]
        for ours, theirs in pairs:
            a, b = medians[ours], medians[theirs]
            ratios = f"{a['infer/s'] / b['infer/s']:.2f}x | {a['p99 ms'] / b['p99 ms']:.2f}x"
            lines.append("| " + " | ".join(ours[1:]) + f" | {ratios} |")
    return "\n".join(lines)


PYTRITON_PEER = Peer(
    *(PYTRITON, "PyTriton 0.7.0", "pytriton", ("nvidia-pytriton==0.7.0", "numpy==1.26.4")),
    lambda bin_dir, ports, work: [
        *(str(bin_dir / "python"), "-m", "benchmarks.peers.pytriton_server"),
        *("--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--access-token", TOKEN),
        *("--workspace", str(work / "pytriton")),
    ],
    "raw",
    extra_ports=1,
)
PYTRITON_STARTS = 3


@contextlib.contextmanager
def serving(server: str, args: argparse.Namespace) -> Iterator[tuple[ServerProcess, int, str | None]]:
    """One started, ready server: (its process, its gRPC port, the token its statistics need)."""
    grpc_port, log = free_port(), args.out / f"{server}.log"
    if server.startswith(GMLP):  # with a peer: the peers' layout, which main() sized by --instances
        layout = gmlp_layout() if args.against else []
        also = args.also.split() if server != GMLP else []
        flags = ["--grpc-port", str(grpc_port), *layout, *also, *args.serve_args.split()]
        with gmlp_serve(args.models.resolve(), log_path=log, serve_args=flags) as process:
            yield process, grpc_port, None
        return

    def ready(s: ServerProcess) -> bytes:  # the model's: Triton is ready before PyTriton binds it
        return http_get(f"{s.base_url}/v2/models/{args.classifier}/ready")

    # PyTriton's start now and then fails as its stub process connects back to it ("Connection
    # refused" in the handshake); a failed start measures nothing, so it is tried again.
    for attempt in range(1, PYTRITON_STARTS + 1):
        shutil.rmtree(args.out / "pytriton", ignore_errors=True)  # PyTriton refuses a workspace that exists
        model, ports = args.models.resolve() / args.classifier, [free_port(), free_port()]
        with contextlib.ExitStack() as stack:
            try:
                process = stack.enter_context(running(PYTRITON_PEER, args.out, model, ready, ports))
            except RuntimeError as exc:
                if attempt == PYTRITON_STARTS:
                    raise
                note = f"PyTriton did not start ({exc}); start {attempt + 1} of {PYTRITON_STARTS}"
                print(note, file=sys.stderr)
                continue
            yield process, ports[1], TOKEN
            return


def loads(
    args: argparse.Namespace,
    command: list[str],
    base: list[str],
    stem: Path,
    process: ServerProcess,
    model: str,
    token: str | None,
) -> Iterator[tuple[str, dict[str, float]]]:
    """(load, figures) of the closed loop at each client count, then of the Poisson open loop at
    each fraction of the closed loop's best throughput; a load that measured nothing is left out."""
    best = 0.0
    for c in args.concurrency:
        label = f"{c} client{'s' if c > 1 else ''}"
        path = stem.with_name(f"{stem.name}-c{c}")
        row, cpu = measured(command, [*base, "--concurrency-range", str(c)], path, process, model, token)
        if row:
            best = max(best, float(row["Inferences/Second"]))
            yield label, figures(row, cpu)
    for fraction in args.rate_fractions.split(",") if best else []:
        flags = [*base, "--request-rate-range", str(max(1, round(best * float(fraction)))), *POISSON_FLAGS]
        path = stem.with_name(f"{stem.name}-r{fraction.replace('.', '_')}")
        row, cpu = measured(command, flags, path, process, model, token)
        if row:
            yield f"Poisson {fraction}x", figures(row, cpu)


def measure(
    server: str, rnd: int, args: argparse.Namespace, window: list[str]
) -> dict[Key, dict[str, float]]:
    """Start `server`, run every model, data set, transport and load against it, stop it."""
    command, out = perf_analyzer_command(), {}
    with serving(server, args) as (process, grpc_port, token):
        names = (
            [args.classifier]
            if args.against
            else [m["name"] for m in get_json(f"{process.base_url}/models")["models"]]
        )
        for name, data in ((n, d) for n in names for d in args.data.split(",")):
            data_file = args.out / f"{name}-{data}.json"
            if not data_file.exists():  # every server and round gets the same inputs
                config = get_json(f"{process.base_url}/v2/models/{name}/config")
                data_file.write_text(json.dumps(input_data(args.models / name, config, data)))
            for transport in args.transports.split(","):
                url = f"127.0.0.1:{process.port if transport == 'http' else grpc_port}"
                base = ["-m", name, "-u", url, "-i", transport, "--input-data", str(data_file), *window]
                base += ["-H", f"{TOKEN_KEYS[transport]}:{token}"] if token else []
                tag = "_".join(server.split())  # the --also server's flags, without spaces
                stem = Path(f"{args.out}/round{rnd}-{tag}-{name}-{transport}-{data}")
                for label, row in loads(args, command, base, stem, process, name, token):
                    out[(server, name, transport, data, label)] = row
    return out


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    window = window_flags(cli, args)
    # SIGTERM unwinds like an exception, so that `with` blocks stop the servers they started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("*.json"):
        stale.unlink()
    servers = [GMLP] + ([f"{GMLP} {args.also}"] if args.against and args.also else [])
    servers += [args.against] if args.against else []
    if args.against:
        os.environ[INSTANCES_ENV] = str(args.instances)  # the peer's execution instances
        ensure_venv(PYTRITON_PEER)
    results: dict[Key, list[dict[str, float]]] = {}
    for rnd in range(args.rounds):
        for server in servers if rnd % 2 == 0 else servers[::-1]:
            print(f"round {rnd + 1}/{args.rounds}: {server}", flush=True)
            for key, figure in measure(server, rnd, args, window).items():
                results.setdefault(key, []).append(figure)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    layout = (
        f"gmlp-serve {args.instances} instances and as many front-ends, PyTriton {args.instances} instances, "
        "max batch 16, 2 ms delay, int8; "
        if args.against
        else ""
    )
    section = (
        f"perf_analyzer {VERSION}, {args.measurement_ms} ms windows, {args.rounds} interleaved round(s), "
        f"medians; {layout}{cpu_line()}. Command: `python -m benchmarks.perf_analyzer {given}`.\n\n"
        + table(results)
    )
    print(section)
    if not args.no_doc:
        begin, end, heading = AGAINST if args.against else (BEGIN, END, HEADING)
        DOC.write_text(replace_section(DOC.read_text(), section, begin, end, heading))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
