"""perf_analyzer against gmlp-serve: both demo models, over REST and gRPC, closed and open loop.

    python -m benchmarks.perf_analyzer --models models     # after `make demo-models`

perf_analyzer is Triton's own load generator; it reads the model's metadata and configuration
(the configuration extension), sends what the configuration requires and reads the server's
queue and compute times from the statistics extension. The benchmark installs perf_analyzer 2.60
itself (`benchmarks.perf_analyzer_install`: pip where the system's glibc is 2.38 or newer, else a
private copy of Debian 13's C library in .bench-tools/), starts one `gmlp serve` with gRPC on the
repository, and runs, for every model, transport (http, grpc) and data set:

- closed loop: `--concurrency-range C` for each of `--concurrency` (clients that each send the next
  request when the last is answered);
- open loop: `--request-rate-range R --request-distribution poisson --async`, at each of
  `--rate-fractions` times the best closed-loop throughput of that model, transport and data.

Data sets, each a perf_analyzer `--input-data` file of the inputs the configuration lists under
the model's name (the graph's tensors; perf_analyzer's own random generator draws token ids
outside the vocabulary, and its random pixels are bytes rather than images' values):

- `random`: values drawn at random, pixels from a normal distribution, token ids from the
  vocabulary (32 tokens, at most the model's n, one mask);
- `real`: the bundled CIFAR-10 test JPEGs through the model's own transform, and the bundled
  Gutenberg sentences through its tokenizer (loadtests/data).

The table (with the machine and the command) replaces the "perf_analyzer" section of
docs/benchmarks.md unless `--no-doc`; every run's perf_analyzer output and CSV are kept in `--out`.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, command_line, cpu_line, free_port, gmlp_serve
from benchmarks.peers.report import publish
from benchmarks.perf_analyzer_install import VERSION, perf_analyzer_command
from contract.image import ImageTransform
from contract.spec import read_spec
from contract.text import FillMaskCodec
from gmlp.proc import tree_cpu_seconds

DATA = REPO / "loadtests" / "data"
DOC = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- perf_analyzer:begin (written by benchmarks/perf_analyzer.py) -->"
END = "<!-- perf_analyzer:end -->"
HEADING = "## perf_analyzer (`benchmarks.perf_analyzer`)"
RANDOM_ROWS, RANDOM_TOKENS = 16, 32


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _entry(name: str, array: np.ndarray) -> dict[str, Any]:
    return {name: {"content": array.ravel().tolist(), "shape": list(array.shape)}}


def _sentences() -> list[str]:
    """The bundled Gutenberg sentences, one [MASK] each (loadtests/data/sentences.tsv)."""
    lines = (DATA / "sentences.tsv").read_text(encoding="utf-8").splitlines()
    return [ln.split("\t", 1)[1].strip() for ln in lines if "\t" in ln and not ln.startswith("#")]


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
            pixels = [transform(p.read_bytes()) for p in sorted(DATA.glob("*.jpg"))]
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
            encoded = [codec.encode(sentence) for sentence in _sentences()]
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


def run_perf_analyzer(
    command: Sequence[str], args: Sequence[str], log: Path, csv_path: Path, timeout_s: float
) -> dict[str, str]:
    """One perf_analyzer run; its CSV row (empty when it measured nothing), output kept in `log`."""
    done = subprocess.run(
        [*command, *args, "-f", str(csv_path)], capture_output=True, text=True, timeout=timeout_s
    )
    log.write_text(" ".join(["perf_analyzer", *args]) + "\n\n" + done.stdout + done.stderr)
    if not csv_path.exists():
        print(f"perf_analyzer failed ({log}):\n{(done.stdout + done.stderr)[-2000:]}", file=sys.stderr)
        return {}
    return csv_row(csv_path)


def csv_row(csv_path: Path) -> dict[str, str]:
    """The measured row of perf_analyzer's `-f` CSV (empty when the file has none)."""
    with csv_path.open() as f:
        return next(csv.DictReader(f), {})


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


class ServerCost:
    """The server's CPU per inference across one perf_analyzer run: user + system time of its
    process tree (/proc) over the inferences its statistics extension counted meanwhile, warm-up
    and unstable windows included, which perf_analyzer's own figures leave out."""

    def __init__(self, pid: int, base_url: str, model: str) -> None:
        self.pid, self.url = pid, f"{base_url}/v2/models/{model}/stats"
        self.start = self._now()

    def _now(self) -> tuple[float, int]:
        stats = _get(self.url)["model_stats"]
        return tree_cpu_seconds(self.pid), sum(int(s["inference_count"]) for s in stats)

    def ms_per_inference(self) -> float | None:
        (cpu0, count0), (cpu1, count1) = self.start, self._now()
        return 1000 * (cpu1 - cpu0) / (count1 - count0) if count1 > count0 else None


def main(argv: list[str] | None = None) -> int:
    parser = command_line(__doc__)
    parser.add_argument(
        "--models", type=Path, default=REPO / "models", help="model repository (default ./models)"
    )
    parser.add_argument("--concurrency", default="1,8,32", help="closed-loop clients (default 1,8,32)")
    parser.add_argument(
        "--rate-fractions", default="0.5,0.9", help="open-loop rates, of the best closed-loop"
    )
    parser.add_argument("--measurement-ms", type=int, default=5000, help="measurement window (default 5000)")
    parser.add_argument(
        "--max-trials", type=int, default=6, help="windows until stable, 3 or more (default 6)"
    )
    parser.add_argument(
        "--stability", type=int, default=10, help="perf_analyzer's --stability-percentage (default 10)"
    )
    parser.add_argument("--transports", default="http,grpc", help="default http,grpc")
    parser.add_argument("--data", default="random,real", help="data sets (default random,real)")
    parser.add_argument("--serve-args", default="", help="extra `gmlp serve` flags, space separated")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "perf_analyzer", help="raw outputs")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.max_trials < 3:
        parser.error("--max-trials must be 3 or more: perf_analyzer compares the last three windows")
    # A SIGTERM unwinds like an exception, so the server below is stopped, not left running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    command = perf_analyzer_command()
    args.out.mkdir(parents=True, exist_ok=True)
    grpc_port = free_port()
    server = gmlp_serve(
        args.models.resolve(),
        log_path=args.out / "server.log",
        serve_args=["--grpc-port", str(grpc_port), *args.serve_args.split()],
    )
    window = ["--measurement-interval", str(args.measurement_ms), "--max-trials", str(args.max_trials)]
    window += ["--stability-percentage", str(args.stability)]
    rows: list[str] = []
    with server:
        names = [m["name"] for m in _get(f"{server.base_url}/models")["models"]]
        for name in names:
            config = _get(f"{server.base_url}/v2/models/{name}/config")
            model_dir = args.models / name
            for data in args.data.split(","):
                data_file = args.out / f"{name}-{data}.json"
                data_file.write_text(json.dumps(input_data(model_dir, config, data)))
                for transport in args.transports.split(","):
                    url = f"127.0.0.1:{server.port if transport == 'http' else grpc_port}"
                    base = ["-m", name, "-u", url, "-i", transport, "--input-data", str(data_file), *window]
                    best = 0.0
                    runs = [("c", c, ["--concurrency-range", c]) for c in args.concurrency.split(",")]
                    for kind, level, load in runs:
                        stem = args.out / f"{name}-{transport}-{data}-{kind}{level}"
                        cost = ServerCost(server.pid, server.base_url, name)
                        row = run_perf_analyzer(
                            command, [*base, *load], stem.with_suffix(".txt"), stem.with_suffix(".csv"), 600
                        )
                        if row:
                            best = max(best, float(row["Inferences/Second"]))
                            cpu_ms = cost.ms_per_inference()
                            rows.append(table_row(name, transport, data, f"{level} clients", row, cpu_ms))
                    for fraction in args.rate_fractions.split(",") if best else []:
                        rate = max(1, round(best * float(fraction)))
                        load = [
                            "--request-rate-range",
                            str(rate),
                            "--request-distribution",
                            "poisson",
                            "--async",
                        ]
                        stem = args.out / f"{name}-{transport}-{data}-r{fraction.replace('.', '_')}"
                        cost = ServerCost(server.pid, server.base_url, name)
                        row = run_perf_analyzer(
                            command, [*base, *load], stem.with_suffix(".txt"), stem.with_suffix(".csv"), 600
                        )
                        if row:
                            rows.append(
                                table_row(
                                    name,
                                    transport,
                                    data,
                                    f"Poisson {rate}/s ({fraction}x)",
                                    row,
                                    cost.ms_per_inference(),
                                )
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
    publish(section, DOC, BEGIN, END, HEADING, write=not args.no_doc)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
