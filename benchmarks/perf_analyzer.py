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
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, command_line, cpu_line, stop_on_sigterm
from benchmarks.peers.report import replace_section
from benchmarks.perf_analyzer_install import VERSION, perf_analyzer_command
from contract.image import ImageTransform
from contract.spec import read_spec
from contract.text import FillMaskCodec
from gmlp.proc import tree_cpu_seconds
from gmlp.server_process import ServerProcess, free_port, get_json, gmlp_serve
from loadtests.workload import BUNDLED_DIR, BUNDLED_SENTENCES, read_sentences_tsv

DOC = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- perf_analyzer:begin (written by benchmarks/perf_analyzer.py) -->"
END = "<!-- perf_analyzer:end -->"
HEADING = "## perf_analyzer (`benchmarks.perf_analyzer`)"
RANDOM_ROWS, RANDOM_TOKENS = 16, 32
POISSON_FLAGS = ("--request-distribution", "poisson", "--async")


def _levels(text: str) -> list[int]:
    levels = [int(c) for c in text.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise ValueError(f"client counts must be positive integers, not {text!r}")
    return levels


def parser() -> argparse.ArgumentParser:
    """The command line; the measurement window's flags are perf_analyzer's own."""
    parser = command_line(__doc__)
    parser.add_argument(
        "--models", type=Path, default=REPO / "models", help="model repository (default ./models)"
    )
    parser.add_argument(
        "--concurrency", type=_levels, default=[1, 8, 32], help="closed-loop clients (default 1,8,32)"
    )
    parser.add_argument("--transports", default="http,grpc", help="default http,grpc")
    parser.add_argument("--measurement-ms", type=int, default=5000, help="measurement window (default 5000)")
    parser.add_argument(
        "--max-trials", type=int, default=6, help="windows until stable, 3 or more (default 6)"
    )
    parser.add_argument(
        "--stability", type=int, default=10, help="perf_analyzer's --stability-percentage (default 10)"
    )
    parser.add_argument(
        "--rate-fractions", default="0.5,0.9", help="open-loop rates, of the best closed-loop"
    )
    parser.add_argument("--data", default="random,real", help="data sets (default random,real)")
    parser.add_argument("--serve-args", default="", help="extra `gmlp serve` flags, space separated")
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
    return [
        *("--measurement-interval", str(args.measurement_ms), "--max-trials", str(args.max_trials)),
        *("--stability-percentage", str(args.stability)),
    ]


def _entry(name: str, array: np.ndarray) -> dict[str, Any]:
    return {name: {"content": array.ravel().tolist(), "shape": list(array.shape)}}


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
        return {"data": [_entry("pixel_values", p) for p in pixels]}
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
        rows = [
            {
                **_entry("input_ids", ids.astype(np.int64)),
                **_entry("mask_positions", positions.astype(np.int64)),
            }
            for ids, positions in texts
        ]
        return {"data": rows}
    raise SystemExit(f"model {config['name']}: no data for the required inputs {required}")


def measured(
    command: Sequence[str], flags: Sequence[str], stem: Path, server: ServerProcess, model: str
) -> tuple[dict[str, str], float | None]:
    """One perf_analyzer run, its output and CSV kept beside `stem`: the measured row of the CSV
    (empty when it measured nothing) and the server's CPU ms per inference over the run. That is
    user + system time of the server's process tree (/proc) over the inferences its statistics
    extension counted meanwhile, warm-up and unstable windows included, which perf_analyzer's own
    figures leave out."""

    def now() -> tuple[float, int]:
        stats = get_json(f"{server.base_url}/v2/models/{model}/stats")["model_stats"]
        return tree_cpu_seconds(server.pid), sum(int(s["inference_count"]) for s in stats)

    cpu0, count0 = now()
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
    cpu1, count1 = now()
    return row, 1000 * (cpu1 - cpu0) / (count1 - count0) if count1 > count0 else None


def _us(row: dict[str, str], key: str) -> float:
    return float(row.get(key) or 0.0)


def table_row(
    model: str, transport: str, data: str, load: str, row: dict[str, str], cpu_ms: float | None = None
) -> str:
    """One table line; `cpu_ms`: the server's CPU per inference over the run (blank when unknown)."""
    server = _us(row, "Server Queue") + _us(row, "Server Compute Input") + _us(row, "Server Compute Infer")
    cpu = "" if cpu_ms is None else f"{cpu_ms:.2f}"
    return (
        f"| {model} | {transport} | {data} | {load} | {float(row['Inferences/Second']):.0f} "
        f"| {_us(row, 'p50 latency') / 1000:.1f} | {_us(row, 'p99 latency') / 1000:.1f} "
        f"| {_us(row, 'Server Queue') / 1000:.2f} | {server / 1000:.2f} | {cpu} |"
    )


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    window = window_flags(cli, args)
    stop_on_sigterm()
    command = perf_analyzer_command()
    args.out.mkdir(parents=True, exist_ok=True)
    grpc_port = free_port()
    server = gmlp_serve(
        args.models.resolve(),
        log_path=args.out / "server.log",
        serve_args=["--grpc-port", str(grpc_port), *args.serve_args.split()],
    )
    rows: list[str] = []
    with server:
        names = [m["name"] for m in get_json(f"{server.base_url}/models")["models"]]
        for name, data in ((n, d) for n in names for d in args.data.split(",")):
            config = get_json(f"{server.base_url}/v2/models/{name}/config")
            data_file = args.out / f"{name}-{data}.json"
            data_file.write_text(json.dumps(input_data(args.models / name, config, data)))
            for transport in args.transports.split(","):
                url = f"127.0.0.1:{server.port if transport == 'http' else grpc_port}"
                base = ["-m", name, "-u", url, "-i", transport, "--input-data", str(data_file), *window]

                stem = f"{args.out}/{name}-{transport}-{data}-"
                best = 0.0
                for c in args.concurrency:
                    load = ["--concurrency-range", str(c)]
                    row, cpu = measured(command, [*base, *load], Path(f"{stem}c{c}"), server, name)
                    if row:
                        best = max(best, float(row["Inferences/Second"]))
                        rows.append(table_row(name, transport, data, f"{c} clients", row, cpu))
                for fraction in args.rate_fractions.split(",") if best else []:
                    rate = max(1, round(best * float(fraction)))
                    load = ["--request-rate-range", str(rate), *POISSON_FLAGS]
                    path = Path(f"{stem}r{fraction.replace('.', '_')}")
                    row, cpu = measured(command, [*base, *load], path, server, name)
                    if row:
                        rows.append(
                            table_row(name, transport, data, f"Poisson {rate}/s ({fraction}x)", row, cpu)
                        )
    given = " ".join(sys.argv[1:] if argv is None else argv)
    section = "\n".join(
        [
            f"perf_analyzer {VERSION}, {args.measurement_ms} ms windows; {cpu_line()}. "
            f"Command: `python -m benchmarks.perf_analyzer {given}`.",
            "",
            "| model | transport | data | load | infer/s | p50 ms | p99 ms | queue ms | server ms "
            "| server CPU ms/inference |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(section)
    if not args.no_doc:
        DOC.write_text(replace_section(DOC.read_text(), section, BEGIN, END, HEADING))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
