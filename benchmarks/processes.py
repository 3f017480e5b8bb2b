"""The server's process layouts side by side: one process against an engine with front-ends, on the
demo classifier's /classify at 32 clients (wrk) and one client, in interleaved rounds: requests/s,
p50 and p99, and the cores the whole process tree kept busy (docs/benchmarks.md, "Processes").

    python -m benchmarks.processes --model models/cifar10-gmlp --rounds 3 --seconds 8

Every server runs on ONNX Runtime with the defaults but for `--workers`; they run side by side and
take turns (the order flips every round), idle while another is measured.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from benchmarks import wrk
from benchmarks.harness import command_line, cpu_line
from gmlp.server_process import gmlp_serve, link_repository, tree_cpu_seconds

IMAGE = Path("loadtests/data/cifar10-test-03000-cat.jpg")


def measure(
    model_dir: Path,
    work: Path,
    layouts: dict[str, tuple[str, ...]],
    rounds: int,
    seconds: float,
    clients: int,
) -> list[dict[str, object]]:
    repository = link_repository(work / model_dir.name, model_dir)
    body = work / "body"
    boundary = "gmlpbench"
    body.write_bytes(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.jpg"\r\n'
        f"Content-Type: image/jpeg\r\n\r\n".encode()
        + IMAGE.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    script = work / "post.lua"
    script.write_text(wrk.lua_script(body, f"multipart/form-data; boundary={boundary}"))
    figures: dict[str, dict[str, list[float]]] = {n: {} for n in layouts}
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                gmlp_serve(
                    repository,
                    log_path=work / f"{name}.log",
                    serve_args=flags,
                    env={"GMLP_BACKEND": "onnxruntime"},
                )
            )  # fmt: skip
            for name, flags in layouts.items()
        }
        for turn in range(rounds):
            for name in list(servers) if turn % 2 == 0 else list(servers)[::-1]:
                server = servers[name]
                url = f"{server.base_url}/classify?top_k=3"
                wrk.run(url, script, clients, 1.0)  # warm
                cpu0, t0 = tree_cpu_seconds(server.pid), time.monotonic()
                many = wrk.run(url, script, clients, seconds)
                busy = (tree_cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
                one = wrk.run(url, script, 1, seconds / 2)
                row = figures[name]
                for key, value in (
                    ("rps", many.rps),
                    ("p99_ms", many.percentiles_ms.get(99.0, float("nan"))),
                    ("cores_busy", busy),
                    ("errors", many.errors + one.errors),
                    ("one_client_p50_ms", one.percentiles_ms[50.0]),
                ):
                    row.setdefault(key, []).append(value)
    return [
        {"layout": name, **{k: round(statistics.median(v), 3) for k, v in row.items()}, "rounds": row}
        for name, row in figures.items()
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--model", type=Path, default=Path("models/cifar10-gmlp"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--fronts", default="2", help="comma-separated front-end counts to compare with one process"
    )
    args = parser.parse_args(argv)
    layouts: dict[str, tuple[str, ...]] = {"one process": ("--workers", "1")}
    layouts |= {f"engine + {n} front-ends": ("--workers", n) for n in args.fronts.split(",")}
    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp:
        for row in measure(args.model, Path(tmp), layouts, args.rounds, args.seconds, args.clients):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
