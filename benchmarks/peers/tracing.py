"""What tracing costs: the peer benchmark's gmlp-serve /classify with tracing off, on at 100%
sampling and on at 1%, interleaved round by round, spans exported over OTLP/HTTP to a receiver in
this process (benchmarks.otlp_sink, standing in for a collector).

    .venv/bin/python -m benchmarks.peers.tracing            # 3 rounds, c = 1 and 32, 10 s a row
    .venv/bin/python -m benchmarks.peers.tracing --quick    # 1 round, c = 32, 3 s a row

The server, its flags and the request are the peer benchmark's gmlp-serve row (raw JPEG body,
int8, the same instances and threads); only the standard OTEL_* variables differ. Prints one
line per row and, per concurrency, the median throughput and p99 of each mode and their ratios
to tracing off (what docs/benchmarks.md records). Needs wrk and the `otel` extra.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import command_line, cpu_line, link_repository
from benchmarks.otlp_sink import OtlpSink
from benchmarks.peers.bench import CIFAR, Row, measure_row, test_images, write_script
from benchmarks.peers.model import INSTANCES_ENV
from benchmarks.peers.peers import PEERS, Peer
from benchmarks.peers.run import MODEL, ensure_model
from benchmarks.peers.server import running, wait_ready


def modes(endpoint: str) -> dict[str, dict[str, str]]:
    """The environment of each measured mode."""
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "gmlp-serve-bench"}
    return {
        "off": {},
        "on-100%": {**on, "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
        "on-1%": {**on, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    }


def measure(peer: Peer, work: Path, rounds: int, levels: list[int], seconds: float) -> list[Row]:
    image = next(iter(test_images().values()))
    rows: list[Row] = []
    with OtlpSink() as sink:
        variants = [
            dataclasses.replace(peer, key=key, env={**peer.env, **env})
            for key, env in modes(sink.endpoint).items()
        ]
        for rnd in range(rounds):
            for variant in variants[rnd % len(variants) :] + variants[: rnd % len(variants)]:
                with running(variant, work, MODEL) as server:
                    wait_ready(server, image)
                    script = write_script(work, "tracing", image, variant.body)
                    measure_row(server, script, (rnd, CIFAR), 8, min(2.0, seconds))  # warm-up
                    for c in levels:
                        row = measure_row(server, script, (rnd, CIFAR), c, seconds)
                        rows.append(row)
                        print(
                            f"  {row.peer:9s} c={c:<3d} {row.rps:8.1f} req/s  p99 {row.p99_ms:7.2f} ms"
                            f"  errors {row.errors}",
                            flush=True,
                        )
        print(f"  spans received: {len(sink.received())}")
    return rows


def summary(rows: list[Row]) -> list[str]:
    """Per concurrency: each mode's median req/s and p99, and its ratio to tracing off."""
    lines = [
        "| clients | tracing | req/s | p99 ms | req/s vs off | p99 vs off |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted({r.concurrency for r in rows}):
        medians = {}
        for mode in dict.fromkeys(r.peer for r in rows):
            mine = [r for r in rows if r.peer == mode and r.concurrency == c]
            medians[mode] = (
                statistics.median(r.rps for r in mine),
                statistics.median(r.p99_ms for r in mine),
            )
        base_rps, base_p99 = medians["off"]
        for mode, (rps, p99) in medians.items():
            lines.append(
                f"| {c} | {mode} | {rps:.1f} | {p99:.2f} | {rps / base_rps:.3f} | {p99 / base_p99:.3f} |"
            )
    return lines


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, c = 32, 3 s rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,32")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk row")
    parser.add_argument(
        "--instances", type=int, default=2, help="execution instances (the peer benchmark's default)"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian/Ubuntu: apt-get install -y wrk)")
    if args.quick:
        args.rounds, args.levels, args.duration = 1, "32", 3.0
    os.environ[INSTANCES_ENV] = str(args.instances)
    (peer,) = [p for p in PEERS if p.key == "gmlp-serve"]
    ensure_model()
    with tempfile.TemporaryDirectory(prefix="gmlp-tracing-") as tmp:
        work = Path(tmp)
        link_repository(work, MODEL)
        rows = measure(peer, work, args.rounds, [int(c) for c in args.levels.split(",")], args.duration)
    print(cpu_line())
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
