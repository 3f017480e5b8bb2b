"""Where a served request's CPU goes: per-thread CPU from /proc and a py-spy profile.

`--task classify` starts gmlp-serve as the peer benchmark does (benchmarks/peers: the same flags,
demo classifier and CIFAR-10 JPEG), its instances in one process rather than as workers;
`--task fill-mask` the demo masked LM alone with its default settings, sent the 200 bundled
masked sentences in turn. wrk loads it at one client count while py-spy samples
it. The report gives requests/s, the CPU per request of the event loop (the main thread: HTTP,
routing, preprocessing, responses) and of the other threads (batches in ONNX Runtime), the
batches' mean size and how busy the execution instances were, and the event loop's samples by
layer and by function, each as a share and as CPU per request. Set against raw `session.run`'s
CPU per item (the bare pipeline's figures), it says what serving adds and who adds it. Needs
wrk and py-spy (the dev install); py-spy needs ptrace rights over the server.

    python -m benchmarks.profile --task classify --clients 32 --seconds 10
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks import wrk
from benchmarks.bare_pipeline import sentences
from benchmarks.harness import REPO, command_line, cpu_facts
from benchmarks.peers.model import INSTANCES_ENV
from benchmarks.peers.peers import PEERS, gmlp_argv
from benchmarks.peers.run import MODEL, ensure_model, started
from gmlp.server_process import (
    ServerProcess,
    get_json,
    gmlp_serve,
    http_get,
    link_repository,
    machine_busy_seconds,
    reaped_children_cpu_seconds,
    thread_cpu_seconds,
)
from loadtests.runner import sample_totals

# The layer of a sample is that of its innermost frame, by the frame's file (as py-spy names it).
# A sample whose innermost Python frame is the loop's `run` is in uvloop's C code (polling,
# socket reads and writes, scheduling callbacks): py-spy shows native code as its Python caller.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event loop (uvloop's C code, asyncio)", ("asyncio/", "runners.py", "uvloop")),
    ("uvicorn (HTTP parsing, writes)", ("uvicorn/",)),
    ("Starlette, FastAPI", ("starlette/", "fastapi/")),
    ("service (middleware, routes, batching)", ("service/",)),
    ("preprocessing and scores (contract, numpy)", ("contract/", "numpy/", "PIL/", "simplejpeg")),
    ("metrics (prometheus-client)", ("prometheus_client/",)),
)
OTHER = "other (json, contextlib, pydantic, threading...)"


def py_spy() -> str | None:
    """py-spy of this environment (its scripts directory need not be on PATH), else PATH's."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int


def parse_frame(text: str) -> Frame:
    """One frame of py-spy's raw output: `function (file:line)` (a function name has no spaces)."""
    function, _, where = text.partition(" (")
    file, _, line = where.rstrip(")").rpartition(":")
    return Frame(function or text, file, int(line) if line.isdigit() else 0)


def thread_stacks(raw: str, tid: int) -> collections.Counter[tuple[Frame, ...]]:
    """Sample counts per stack (outermost frame first) of thread `tid` (a process's main thread
    has the process id), from `py-spy record --format raw --threads`, whose lines read
    `thread (tid)[: name];frame;frame... count`."""
    stacks: collections.Counter[tuple[Frame, ...]] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        if head.partition(")")[0] != f"thread ({tid}" or not frames:
            continue
        stacks[tuple(parse_frame(f) for f in frames)] += int(count)
    return stacks


def layer(frame: Frame) -> str:
    for name, markers in LAYERS:
        if any(marker in frame.file for marker in markers):
            return name
    return OTHER


def function(frame: Frame) -> str:
    return f"{frame.function} ({frame.file})"


def samples_by(
    stacks: collections.Counter[tuple[Frame, ...]], key: Callable[[Frame], str]
) -> collections.Counter[str]:
    """Samples per `key` (`layer`, `function`) of the innermost frame: its own time, not its callees'."""
    totals: collections.Counter[str] = collections.Counter()
    for stack, count in stacks.items():
        totals[key(stack[-1])] += count
    return totals


def table(counts: collections.Counter[str], ms_per_request: float, top: int | None = None) -> list[str]:
    """Markdown rows: share of the samples and the CPU per request it stands for."""
    total = sum(counts.values()) or 1
    rows = ["| | share of samples | CPU ms/request |", "|---|---:|---:|"]
    for name, count in counts.most_common(top):
        rows.append(f"| {name} | {100 * count / total:.1f} % | {ms_per_request * count / total:.3f} |")
    return rows


def batch_totals(base_url: str) -> list[float]:
    """[batches, items in them, seconds spent running them] so far, all models, from /metrics."""
    totals = sample_totals(http_get(f"{base_url}/metrics", timeout_s=10).decode(), lambda s: s.name)
    return [totals[n] for n in ("gmlp_batch_size_count", "gmlp_batch_size_sum", "gmlp_inference_seconds_sum")]


# A started server to load (its `url` the route loaded) and the wrk script that loads it.
Target = tuple[ServerProcess, Path]


def classify_target(work: Path) -> contextlib.AbstractContextManager[Target]:
    """gmlp-serve as the peer benchmark runs it, but its instances in one process (the report
    reads one event loop and one process's threads), sent one CIFAR-10 JPEG."""
    link_repository(work, MODEL)
    peer = next(p for p in PEERS if p.key == "gmlp-serve")
    return started(dataclasses.replace(peer, argv=functools.partial(gmlp_argv, workers=False)), work)


@contextlib.contextmanager
def fill_mask_target(work: Path) -> Iterator[Target]:
    """The demo masked LM alone with its default settings, sent the bundled masked sentences in turn."""
    bodies = [json.dumps({"text": text, "top_k": 5}) for text in sentences()]
    repository = link_repository(work, REPO / "models" / "gutenberg-gmlp-mlm")
    log, serve_args = work / "server.log", ["--log-level", "warning"]
    server = gmlp_serve(
        repository, log_path=log, serve_args=serve_args, ready_timeout_s=180, path="/fill-mask"
    )
    with server:
        answer = get_json(server.url, 30, {"Content-Type": "application/json"}, bodies[0].encode())
        assert len(answer["predictions"][0]) == 5  # a real answer before any timing
        script = work / "fill_mask.lua"
        script.write_text(wrk.lua_rotating("/fill-mask", bodies))
        yield server, script


TARGETS = {"classify": classify_target, "fill-mask": fill_mask_target}


def profile(target: Target, args: argparse.Namespace, work: Path) -> Iterator[str]:
    """Warm up, then load for `--seconds` while py-spy samples the server `--rate` times a second;
    the report's lines."""
    server, script = target
    wrk.run(server.url, script, args.clients, args.warmup)
    out = work / "profile.txt"
    spy = [py_spy() or "py-spy", "record", "--pid", str(server.pid), "--threads", "--nonblocking"]
    spy += ["--format", "raw", "--rate", str(args.rate), "--duration", str(int(args.seconds) + 2)]
    sampler = subprocess.Popen(
        [*spy, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    time.sleep(1.0)  # py-spy attaches before the timed load starts
    before, wrk0, busy0, batches0, t0 = (
        thread_cpu_seconds(server.pid),
        reaped_children_cpu_seconds(),
        machine_busy_seconds(),
        batch_totals(server.base_url),
        time.monotonic(),
    )
    result = wrk.run(server.url, script, args.clients, args.seconds)
    wall_s = time.monotonic() - t0
    after, wrk_s = thread_cpu_seconds(server.pid), reaped_children_cpu_seconds() - wrk0
    busy_s = machine_busy_seconds() - busy0
    batches, batched, batch_s = (b - a for a, b in zip(batches0, batch_totals(server.base_url), strict=True))
    _, err = sampler.communicate(timeout=args.seconds + 60)
    if sampler.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({sampler.returncode}): {err.decode(errors='replace')}")
    (model,) = get_json(f"{server.base_url}/models")["models"]  # the one model served
    instances, info = int(model["instances"]), cpu_facts()
    main_s = after.get(server.pid, 0.0) - before.get(server.pid, 0.0)
    other_s = sum(after.values()) - sum(before[t] for t in after if t in before) - main_s
    per_request = 1000.0 / max(result.requests, 1)
    main_ms, other_ms = main_s * per_request, other_s * per_request
    stacks = thread_stacks(out.read_text(), server.pid)
    yield f"Measured {datetime.date.today()} on {info.get('cpu', '?')}, {info.get('cpus', '?')} CPUs"
    yield f"(SIMD: {info.get('simd', '?')}), Python {info['python']}: wrk, {args.clients} connections,"
    yield f"{args.seconds:.0f} s, py-spy sampling the server."
    yield ""
    yield "| | |"
    yield "|---|---:|"
    yield f"| requests/s | {result.rps:.0f} |"
    yield f"| server CPU ms/request | {main_ms + other_ms:.2f} |"
    yield f"| of which the event loop (main thread) | {main_ms:.2f} |"
    yield f"| of which other threads (batches in ONNX Runtime) | {other_ms:.2f} |"
    yield f"| wrk's CPU ms/request (the load generator, on the same CPUs) | {wrk_s * per_request:.2f} |"
    yield f"| server CPUs in use (of {info.get('cpus', '?')}) | {(main_s + other_s) / wall_s:.2f} |"
    yield f"| machine CPUs busy (every process, and time the host took) | {busy_s / wall_s:.2f} |"
    yield f"| batches: mean size | {batched / max(batches, 1):.1f} |"
    busy = batch_s / (wall_s * instances)
    yield f"| batches: share of the time the {instances} execution instances ran one | {100 * busy:.0f} % |"
    yield f"| event-loop samples | {sum(stacks.values())} |"
    yield ""
    yield "The event loop's CPU by layer (innermost frame):"
    yield ""
    yield from table(samples_by(stacks, layer), main_ms)
    yield ""
    yield f"Its {args.top} busiest functions (own time):"
    yield ""
    yield from table(samples_by(stacks, function), main_ms, args.top)


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--task", choices=sorted(TARGETS), default="classify")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the profile")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--instances", type=int, default=2, help="classify: execution instances, as in the peer run"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian/Ubuntu: apt-get install -y wrk)")
    if py_spy() is None:
        raise SystemExit("py-spy is not installed (it is part of the dev install: pip install py-spy)")
    os.environ[INSTANCES_ENV] = str(args.instances)
    ensure_model()
    with tempfile.TemporaryDirectory(prefix="gmlp-profile-") as tmp, TARGETS[args.task](Path(tmp)) as target:
        lines = list(profile(target, args, Path(tmp)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
