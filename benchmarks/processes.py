"""The server's process layouts side by side: one process against an engine with front-ends, on the
demo classifier's /classify at 32 clients (wrk) and one client, in interleaved rounds: requests/s,
p50 and p99, and the cores the whole process tree kept busy (docs/benchmarks.md, "Processes").

    python -m benchmarks.processes --model models/cifar10-gmlp --rounds 3 --seconds 8

With `--memory MODEL_DIR`, what loading a model costs each layout instead: each server starts in
explicit model control with nothing loaded, then loads the model through the repository API and
answers 16 requests of 8 rows; the growth of the whole process tree's PSS (psutil, each process's
proportional share of the pages it maps) against the size of the served file, once loaded (its
warm-up included) and after the requests:

    python -m benchmarks.processes --memory /path/to/gmlp-s16-224 --rounds 3

Every server runs on ONNX Runtime with the defaults but for `--workers`; they run side by side and
take turns (the order flips every round), idle while another is measured. `--baseline DIR` adds
one process of another checkout's code (an earlier commit, `git worktree add DIR REV`), run with
this environment's packages: a before/after in the same rounds.

    python -m benchmarks.processes --fronts "" --baseline /tmp/before --rounds 5 --seconds 6
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import psutil

from benchmarks import wrk
from benchmarks.harness import command_line, cpu_line, onnxruntime_servers
from gmlp.server_process import gmlp_serve, link_repository, tree_cpu_seconds, tree_pids
from service.access.keys import key_line, new_key

IMAGE = Path("loadtests/data/cifar10-test-03000-cat.jpg")


def measure(
    model_dir: Path,
    work: Path,
    layouts: dict[str, tuple[str, ...]],
    rounds: int,
    seconds: float,
    clients: int,
    checkouts: dict[str, Path] | None = None,
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
        servers = onnxruntime_servers(stack, repository, layouts, work, checkouts=checkouts)
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


def tree_pss(root: int) -> int:
    """Bytes of PSS of `root` and its descendants."""
    total = 0
    for pid in tree_pids(root):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_full_info().pss
    return total


def load_growth(
    model_dir: Path,
    work: Path,
    layouts: dict[str, tuple[str, ...]],
    rounds: int,
    checkouts: dict[str, Path] | None = None,
) -> list[dict[str, object]]:
    """Each layout's PSS growth from loading `model_dir` (module docstring), per round."""
    repository = link_repository(work, model_dir)
    key = new_key()
    keys = work / "keys"
    keys.write_text(key_line("operator", "admin,infer", key) + "\n")
    keys.chmod(0o600)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    config = json.loads((model_dir / "config.json").read_text())
    served = (
        model_dir / config["variants"][next(iter(v for v in ("int8", "fp32") if v in config["variants"]))]
    )
    growth: dict[str, dict[str, list[float]]] = {name: {"loaded": [], "served": []} for name in layouts}
    for turn in range(rounds):
        for name in list(layouts) if turn % 2 == 0 else list(layouts)[::-1]:
            flags = ("--model-control", "explicit", "--api-keys-file", str(keys), *layouts[name])
            with gmlp_serve(repository, log_path=work / f"{name}-memory.log", serve_args=flags,
                            env={"GMLP_BACKEND": "onnxruntime"}, ready_timeout_s=300,
                            cwd=(checkouts or {}).get(name)) as server:  # fmt: skip
                time.sleep(2)
                before = tree_pss(server.pid)
                base = f"{server.base_url}/v2/repository/models/{model_dir.name}/load"
                post(base, b"{}", headers, timeout=600)
                time.sleep(1)
                growth[name]["loaded"].append((tree_pss(server.pid) - before) / served.stat().st_size)
                meta = json.loads(post(f"{server.base_url}/v2/models/{model_dir.name}", None, headers))
                (entry,) = meta["inputs"]
                shape = [8, *entry["shape"][1:]]
                data = np.zeros(shape, dtype=np.float32)
                body = json.dumps({"inputs": [{"name": entry["name"], "shape": shape, "datatype": "FP32",
                                               "data": data.ravel().tolist()}]}).encode()  # fmt: skip
                for _ in range(16):
                    post(f"{server.base_url}/v2/models/{model_dir.name}/infer", body, headers, timeout=120)
                time.sleep(1)
                growth[name]["served"].append((tree_pss(server.pid) - before) / served.stat().st_size)
    return [
        {"layout": name, "file_mib": round(served.stat().st_size / 2**20, 1),
         **{f"{when}_x_file": round(statistics.median(v), 2) for when, v in seen.items()}, "rounds": seen}
        for name, seen in growth.items()
    ]  # fmt: skip


def post(url: str, body: bytes | None, headers: dict[str, str], timeout: float = 30) -> bytes:
    """A POST (GET without a body) answered 200; its body."""
    request = urllib.request.Request(
        url, data=body, headers=headers, method="POST" if body is not None else "GET"
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read()


def main(argv: Sequence[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--model", type=Path, default=Path("models/cifar10-gmlp"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--memory", type=Path, help="a served model directory: measure its load's memory")
    parser.add_argument(
        "--fronts",
        default="2",
        help="comma-separated front-end counts to compare with one process ('': none)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (git worktree add DIR REV): its one process joins the rounds",
    )
    args = parser.parse_args(argv)
    layouts: dict[str, tuple[str, ...]] = {"one process": ("--workers", "1")}
    layouts |= {f"engine + {n} front-ends": ("--workers", n) for n in args.fronts.split(",") if n}
    checkouts = {}
    if args.baseline is not None:
        layouts["baseline: one process"] = ("--workers", "1")
        checkouts["baseline: one process"] = args.baseline.resolve()
    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp:
        if args.memory is not None:
            rows = load_growth(args.memory.resolve(), Path(tmp), layouts, args.rounds, checkouts)
        else:
            rows = measure(args.model, Path(tmp), layouts, args.rounds, args.seconds, args.clients, checkouts)
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
