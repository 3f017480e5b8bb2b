"""Failures and latency across model-version swaps: /classify p50/p99 at steady state against
during swaps, at the same load, on one `gmlp serve` watching its repository (poll mode).

    python -m benchmarks.swap --model models/cifar10-gmlp --concurrency 8 --steady-s 10 --swaps 3

Each swap moves a copy of the model (or of `--model-v2`) into the repository as the next version
with one rename, then waits until the index shows it READY and its predecessor unloaded: a full
load, warm-up, recorded check and drain. A request counts as "during a swap" when it started
between a deployment and one second after its swap ended. The server holds one key with every
scope (the repository index is an admin route), which every request sends.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import command_line, cpu_line
from gmlp.server_process import get_json, gmlp_serve
from loadtests.engine import LoadResult, Outcome, PreparedRequest, run_closed_loop
from loadtests.workload import BUNDLED_DIR
from service.access.keys import key_line, new_key

IMAGE = BUNDLED_DIR / "cifar10-test-03000-cat.jpg"
# The key every request sends (the server's keys file holds its digest).
KEY = new_key()


def _swapped(base_url: str, name: str, expected: dict[str, str]) -> None:
    """A readiness probe: raises KeyError ("not yet") until the repository index shows `expected`
    (version -> state) for `name`."""
    index = get_json(f"{base_url}/v2/repository/index", 30, {"Authorization": f"Bearer {KEY}"}, b"")
    if {e["version"]: e["state"] for e in index if e["name"] == name} != expected:
        raise KeyError("the swap has not finished")


def _row(label: str, group: list[Outcome]) -> str:
    load = LoadResult(0, outcomes=group)
    p50, p99 = (load.percentile_ms(q) or float("nan") for q in (50, 99))
    return f"| {label} | {len(group)} | {load.failed} | {p50:.1f} | {p99:.1f} |"


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--model", type=Path, required=True, help="an exported model directory (version 1)")
    parser.add_argument("--model-v2", type=Path, help="the directory to deploy as each new version")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    parser.add_argument("--steady-s", type=float, default=10.0, help="steady state before, between and after")
    parser.add_argument("--swaps", type=int, default=3, help="versions deployed one after the other")
    parser.add_argument("--poll-s", type=float, default=0.5, help="GMLP_REPOSITORY_POLL_S of the server")
    args = parser.parse_args(argv)
    name = "model"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        shutil.copytree(args.model, repo / name / "1")
        keys = Path(tmp) / "api-keys"
        keys.write_text(key_line("operator", "infer,admin,metrics", KEY) + "\n")
        server = gmlp_serve(
            repo,
            log_path=Path(tmp) / "server.log",
            serve_args=["--model-control", "poll", "--repository-poll-s", str(args.poll_s)]
            + ["--api-keys-file", str(keys)],
        )
        windows: list[tuple[float, float]] = []
        stop = threading.Event()
        loads: list[LoadResult] = []
        with server:
            options = {"concurrency": args.concurrency, "seconds": 86_400.0, "stop": stop.is_set}
            # A bundled JPEG with the key; any 200 counts (a swapped-in model may answer otherwise).
            auth = (("Authorization", f"Bearer {KEY}"),)
            request = PreparedRequest(
                "/classify", IMAGE.read_bytes(), "image/jpeg", lambda answer: None, auth
            )
            load = threading.Thread(
                target=lambda: loads.append(run_closed_loop(server.base_url, [request], **options))
            )
            load.start()
            time.sleep(args.steady_s)
            for version in range(2, args.swaps + 2):
                staging = Path(tmp) / f"staging-{version}"
                shutil.copytree(args.model_v2 or args.model, staging)
                began = time.perf_counter()
                staging.rename(repo / name / str(version))
                expected = {str(v): "UNAVAILABLE" for v in range(1, version)} | {str(version): "READY"}
                server.wait_ready(functools.partial(_swapped, server.base_url, name, expected), 120)
                windows.append((began, time.perf_counter() + 1.0))
                time.sleep(args.steady_s)
            stop.set()
            load.join(120)
    outcomes = loads[0].outcomes
    in_swap = [any(a <= o.started <= b for a, b in windows) for o in outcomes]
    print(cpu_line())
    print(
        f"concurrency {args.concurrency}, {args.swaps} swaps, "
        f"swap windows {[round(b - a, 1) for a, b in windows]} s"
    )
    print("| phase | requests | failed | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    print(_row("steady state", [o for o, flag in zip(outcomes, in_swap, strict=True) if not flag]))
    print(_row("during swaps", [o for o, flag in zip(outcomes, in_swap, strict=True) if flag]))


if __name__ == "__main__":
    main()
