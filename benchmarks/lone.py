"""One client's p50 with a lone request's threads as the service's rule of the model's shapes sets
them (`GMLP_LONE_THREADS` unset) against every lone request on its instance's threads
(`--lone-threads 0`), on each demo model, in interleaved rounds: the check of the rule's threshold
on the CPU at hand (docs/service.md, "Batching").

    python -m benchmarks.lone --models models/gutenberg-gmlp-mlm,models/cifar10-gmlp --rounds 4

Both servers of a model run side by side, each on ONNX Runtime, and take turns (the order flips
every round); a round's figure is the median latency of one closed-loop client over `--seconds`.
Where the rule leaves a model without a lone session, the two servers run alike and their gap is
the measurement's noise.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import command_line, cpu_line, onnxruntime_servers
from gmlp.server_process import get_json, link_repository
from loadtests.engine import run_closed_loop, task_requests

LAYOUTS = {"rule": (), "off": ("--lone-threads", "0")}


def measure(model_dir: Path, work: Path, rounds: int, seconds: float) -> list[dict[str, object]]:
    """Each layout's `lone_threads` and per-round p50 on `model_dir`."""
    repository = link_repository(work / model_dir.name, model_dir)
    with ExitStack() as stack:
        servers = onnxruntime_servers(stack, repository, LAYOUTS, work, prefix=f"{model_dir.name}-")
        served = {name: get_json(f"{s.base_url}/models")["models"][0] for name, s in servers.items()}
        first = served["rule"]
        requests = task_requests(first["task"], first["name"], first.get("n"))
        p50s: dict[str, list[float]] = {name: [] for name in servers}
        for turn in range(rounds):
            for name in list(servers) if turn % 2 == 0 else list(servers)[::-1]:
                load = run_closed_loop(
                    servers[name].base_url, requests, concurrency=1, seconds=seconds, warmup_s=0.5
                )
                p50s[name].append(statistics.median(load.latencies_ms))
    return [
        {
            "model": model_dir.name,
            "layout": name,
            "lone_threads": served[name]["lone_threads"],
            "p50_ms_rounds": [round(v, 3) for v in p50s[name]],
            "p50_ms": round(statistics.median(p50s[name]), 3),
        }
        for name in LAYOUTS
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--models", default="models/gutenberg-gmlp-mlm,models/cifar10-gmlp")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="per layout and round")
    args = parser.parse_args(argv)
    print(cpu_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="gmlp-lone-") as tmp:
        for model in args.models.split(","):
            for row in measure(Path(model), Path(tmp), args.rounds, args.seconds):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
