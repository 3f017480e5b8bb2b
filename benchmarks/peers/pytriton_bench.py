"""gmlp-serve against NVIDIA PyTriton on the demo classifier, both measured with perf_analyzer.

    .venv/bin/python -m benchmarks.peers.pytriton_bench     # 3 rounds, c = 1, 8, 32, Poisson; 5 s windows

Both servers serve the same int8 ONNX file with the peer benchmark's settings: 2 execution
instances x 1 intra-op thread (`--instances`), max batch 16, 2 ms queue delay. PyTriton
(`benchmarks/peers/pytriton_server.py`, its own venv under .bench-venvs/pytriton, installed once)
binds the graph's input tensor under the same name, type and shape as gmlp-serve's model
configuration lists as required; the run checks that they agree. perf_analyzer 2.60
(`benchmarks.perf_analyzer_install`) sends both the same `--input-data` file (random pixels) and
measures, over REST and gRPC:

- closed loop at each of `--concurrency` clients;
- open loop (`--async --request-distribution poisson`) at `--rate-fraction` times the server's own
  throughput at the highest `--concurrency` of the same round and transport.

Rounds interleave the servers (each round starts one, measures all, stops it, then the other; the
order alternates), and every figure is the median over rounds. The table (with the machine, the
versions and the command) replaces the "Against PyTriton" section of docs/benchmarks.md unless
`--no-docs`; every run's perf_analyzer output, CSV and results.json are kept in `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, command_line, cpu_line, stop_on_sigterm
from benchmarks.peers.model import INSTANCES_ENV
from benchmarks.peers.peers import PEERS, Peer, Ports, ensure_venv
from benchmarks.peers.report import publish
from benchmarks.peers.server import running
from benchmarks.perf_analyzer import (
    POISSON_FLAGS,
    add_window_options,
    input_data,
    run_perf_analyzer,
    window_flags,
)
from benchmarks.perf_analyzer_install import VERSION as PERF_ANALYZER_VERSION
from benchmarks.perf_analyzer_install import perf_analyzer_command
from gmlp.server_process import ServerProcess, free_port, get_json, http_get, link_repository

MODEL = REPO / "models" / "cifar10-gmlp"
DOC = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- pytriton:begin (written by benchmarks/peers/pytriton_bench.py) -->"
END = "<!-- pytriton:end -->"
HEADING = "## Against PyTriton (`benchmarks.peers.pytriton_bench`)"
PYTRITON_PIN = "nvidia-pytriton==0.7.0"
# PyTriton 0.7.0 requires numpy < 2, so its venv has the last numpy 1 instead of the product's pin.
NUMPY_1 = "numpy==1.26.4"
# The benchmark's own token for Triton's restricted APIs (not a secret: it guards nothing but the
# benchmark's server). perf_analyzer reads the statistics API, which PyTriton restricts by default.
ACCESS_TOKEN = "gmlp_benchmark_triton_access_token"
# The header Triton checks over HTTP; over gRPC it expects the metadata key with a protocol prefix.
ACCESS_HEADERS = {"http": "triton-access-token", "grpc": "triton-grpc-protocol-triton-access-token"}
GMLP_SERVE = next(p for p in PEERS if p.key == "gmlp-serve")


GMLP, PYTRITON = "gmlp-serve", "pytriton"
POISSON = "poisson"


@dataclass(frozen=True)
class Run:
    """One perf_analyzer run: `load` is `c=N` (closed loop) or `poisson` (open loop at `rate`/s)."""

    round: int
    server: str
    transport: str
    load: str
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    rate: float = 0.0

    @classmethod
    def from_csv_row(cls, row: dict[str, str], *, round: int, server: str, transport: str, load: str) -> Run:
        """From a row of perf_analyzer's `-f` CSV (latencies there are in microseconds; an open-loop
        row has the `Request Rate` it was asked for)."""
        return cls(
            round,
            server,
            transport,
            load,
            float(row["Inferences/Second"]),
            float(row["p50 latency"]) / 1000,
            float(row["p99 latency"]) / 1000,
            float(row.get("Request Rate") or 0.0),
        )


def median(runs: Sequence[Run], server: str, transport: str, load: str, field: str) -> float | None:
    """The median of `field` over the rounds of (server, transport, load); None when none ran."""
    values = [
        float(getattr(r, field))
        for r in runs
        if r.server == server and r.transport == transport and r.load == load
    ]
    return statistics.median(values) if values else None


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if mine is None or not theirs else f"{mine / theirs:.2f}x"


def _load_label(runs: Sequence[Run], transport: str, load: str, fraction: float) -> str:
    if load != POISSON:
        clients = int(load.removeprefix("c="))
        return f"{clients} client" + ("s" if clients > 1 else "")
    rates = [median(runs, s, transport, POISSON, "rate") for s in (GMLP, PYTRITON)]
    return f"Poisson, {fraction:g}x capacity ({_num(rates[0], 0)} / {_num(rates[1], 0)} per s)"


def table(runs: Sequence[Run], transports: Sequence[str], loads: Sequence[str], fraction: float) -> str:
    """The markdown table: per transport and load, infer/s and p50/p99 of both servers and ratios."""
    lines = [
        "| transport | load | gmlp-serve infer/s | PyTriton infer/s | infer/s ratio "
        "| gmlp-serve p50 / p99 ms | PyTriton p50 / p99 ms | p99 ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for transport in transports:
        for load in loads:
            figures = {
                (s, f): median(runs, s, transport, load, f)
                for s in (GMLP, PYTRITON)
                for f in ("infer_per_s", "p50_ms", "p99_ms")
            }
            if all(v is None for v in figures.values()):
                continue
            cells = [
                "REST" if transport == "http" else "gRPC",
                _load_label(runs, transport, load, fraction),
                _num(figures[GMLP, "infer_per_s"], 0),
                _num(figures[PYTRITON, "infer_per_s"], 0),
                _ratio(figures[GMLP, "infer_per_s"], figures[PYTRITON, "infer_per_s"]),
                f"{_num(figures[GMLP, 'p50_ms'], 1)} / {_num(figures[GMLP, 'p99_ms'], 1)}",
                f"{_num(figures[PYTRITON, 'p50_ms'], 1)} / {_num(figures[PYTRITON, 'p99_ms'], 1)}",
                _ratio(figures[GMLP, "p99_ms"], figures[PYTRITON, "p99_ms"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pytriton_argv(bin_dir: Path, ports: Ports, work: Path) -> list[str]:
    (grpc,) = ports.extra
    return [
        *(str(bin_dir / "python"), "-m", "benchmarks.peers.pytriton_server", "--http-port", str(ports.http)),
        *("--grpc-port", str(grpc), "--access-token", ACCESS_TOKEN, "--workspace", str(work / "pytriton")),
    ]


PYTRITON_PEER = Peer(
    PYTRITON, "PyTriton 0.7.0", "pytriton", (PYTRITON_PIN, NUMPY_1), _pytriton_argv, "raw", extra_ports=1
)


def parser() -> argparse.ArgumentParser:
    p = command_line(__doc__)
    p.add_argument(
        "--model", type=Path, default=MODEL, help="served classifier directory (default models/cifar10-gmlp)"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds behind each median (default 3)")
    add_window_options(p)
    p.add_argument(
        "--rate-fraction",
        type=float,
        default=0.6,
        help="Poisson rate, of the highest level's infer/s (0: none)",
    )
    p.add_argument("--instances", type=int, default=2, help="execution instances of both servers (default 2)")
    p.add_argument("--out", type=Path, default=REPO / "reports" / "pytriton", help="raw outputs")
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    args.window = window_flags(p, args)
    if args.rounds < 1:
        p.error("--rounds must be 1 or more")
    return args


@contextlib.contextmanager
def serving(server: str, work: Path, model: Path) -> Iterator[tuple[ServerProcess, int]]:
    """One started and ready server: (its process, its gRPC port)."""
    peer = GMLP_SERVE if server == GMLP else PYTRITON_PEER
    ports = Ports(free_port(), (free_port(),))
    flags = ["--grpc-port", str(ports.extra[0])] if server == GMLP else []
    shutil.rmtree(work / "pytriton", ignore_errors=True)  # PyTriton refuses a workspace that exists
    with running(peer, work, model, ports, *flags) as process:
        # The model's readiness: Triton is ready before PyTriton has bound the model.
        ready = f"{process.base_url}/v2/models/{model.name}/ready"
        process.wait_ready(lambda: http_get(ready), timeout_s=240.0)
        yield process, ports.extra[0]


def required_inputs(config: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """(name, data type, dims) of a Triton model configuration's required inputs."""
    return sorted(
        (t["name"], t["data_type"], [int(d) for d in t["dims"]])
        for t in config["input"]
        if not t.get("optional", False)
    )


def run_load(
    command: Sequence[str], flags: Sequence[str], stem: Path, load: str, at: dict[str, Any]
) -> Run | None:
    """One perf_analyzer run (output and CSV kept beside `stem`); None when it measured nothing."""
    row = run_perf_analyzer(command, flags, stem.with_suffix(".txt"), stem.with_suffix(".csv"), 600)
    return Run.from_csv_row(row, load=load, **at) if row else None


def measure_server(
    server: str, rnd: int, args: Any, work: Path, data: Path, configs: dict[str, dict[str, Any]]
) -> list[Run]:
    """Start `server`, run every transport and load of one round against it, stop it."""
    runs: list[Run] = []
    command = perf_analyzer_command()
    name = args.model.name
    with serving(server, work, args.model.resolve()) as (process, grpc_port):
        config = get_json(f"{process.base_url}/v2/models/{name}/config")
        configs[server] = {"config": config, "server": get_json(f"{process.base_url}/v2")}
        if not data.exists():
            data.write_text(json.dumps(input_data(args.model, config, "random")))
        if required_inputs(config) != required_inputs(configs.get(GMLP, configs[server])["config"]):
            raise SystemExit(
                f"PyTriton's required inputs differ from gmlp-serve's: {required_inputs(config)}"
            )
        for transport in args.transports.split(","):
            port = process.port if transport == "http" else grpc_port
            base = [
                *("-m", name, "-u", f"127.0.0.1:{port}", "-i", transport, "--input-data", str(data)),
                *args.window,
            ]
            if server == PYTRITON:
                base += ["-H", f"{ACCESS_HEADERS[transport]}:{ACCESS_TOKEN}"]
            at = {"round": rnd, "server": server, "transport": transport}
            stem = f"round{rnd}-{server}-{transport}-"
            closed = [
                run_load(
                    command, [*base, "--concurrency-range", str(c)], args.out / f"{stem}c{c}", f"c={c}", at
                )
                for c in args.concurrency
            ]
            runs += [r for r in closed if r is not None]
            if closed[-1] is not None and args.rate_fraction > 0:
                rate = max(1, round(closed[-1].infer_per_s * args.rate_fraction))
                flags = [*base, "--request-rate-range", str(rate), *POISSON_FLAGS]
                poisson = run_load(command, flags, args.out / f"{stem}poisson", POISSON, at)
                runs += [poisson] if poisson is not None else []
    return runs


def section(runs: Sequence[Run], args: Any, configs: dict[str, dict[str, Any]], given: str) -> str:
    """The markdown between the markers: conditions, versions, the table and the command."""
    loads = [f"c={c}" for c in args.concurrency] + ([POISSON] if args.rate_fraction > 0 else [])
    versions = {k: v["server"].get("version", "?") for k, v in configs.items()}
    return "\n".join(
        [
            f"{args.rounds} interleaved rounds, medians; perf_analyzer {PERF_ANALYZER_VERSION}, "
            f"{args.measurement_ms} ms windows; both servers {args.instances} instances, max batch 16, "
            f"2 ms queue delay, the int8 file of `{args.model.name}`; gmlp-serve "
            f"{versions.get(GMLP, '?')}, {PYTRITON_PEER.label} (Triton "
            f"{versions.get(PYTRITON, '?')}). {cpu_line()}.",
            "",
            table(runs, args.transports.split(","), loads, args.rate_fraction),
            "",
            f"Command: `{' '.join(['.venv/bin/python -m benchmarks.peers.pytriton_bench', given]).strip()}`.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    os.environ[INSTANCES_ENV] = str(args.instances)
    if not (args.model / "model.int8.onnx").exists():
        raise SystemExit(f"{args.model} has no model.int8.onnx: run `make demo-models`")
    ensure_venv(PYTRITON_PEER)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    link_repository(work, args.model)
    data = args.out / "input-data.json"
    data.unlink(missing_ok=True)
    runs: list[Run] = []
    configs: dict[str, dict[str, Any]] = {}
    for rnd in range(args.rounds):
        order = [GMLP, PYTRITON]
        for server in order if rnd % 2 == 0 else order[::-1]:
            print(f"round {rnd + 1}/{args.rounds}: {server}", flush=True)
            runs += measure_server(server, rnd, args, work, data, configs)
    (args.out / "results.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    (args.out / "configs.json").write_text(json.dumps(configs, indent=1))
    text = section(runs, args, configs, " ".join(sys.argv[1:] if argv is None else argv))
    publish(text, DOC, BEGIN, END, HEADING, write=not args.no_docs)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
