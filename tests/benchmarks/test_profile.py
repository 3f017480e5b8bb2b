"""The request profiler's parts: py-spy's raw stacks read per thread and grouped by layer, and the
per-thread CPU read from /proc. The profiler itself is a command (benchmarks/profile.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks import profile
from gmlp.server_process import thread_cpu_seconds

LOOP = "thread (100): MainThread;Runner.run (asyncio/runners.py:118)"
RAW = "\n".join(
    [
        "thread (100): MainThread;<module> (<string>:1);Runner.run (asyncio/runners.py:118) 30",
        f"{LOOP};classify (service/routes.py:84);PlainJpeg.decode (contract/jpeg.py:55) 10",
        f"{LOOP};RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:524) 8",
        f"{LOOP};classify (service/routes.py:84);PlainJpeg.decode (contract/jpeg.py:56) 2",
        f"{LOOP};iterencode (json/encoder.py:258) 4",
        "thread (1000): Thread-1 (worker);run (onnxruntime/capi/session.py:220) 50",
        "thread (10): MainThread;Runner.run (asyncio/runners.py:118) 7",
    ]
)


def test_frames_keep_names_with_spaces_and_parentheses() -> None:
    frame = profile.parse_frame("<lambda> (<frozen importlib._bootstrap>:1176)")
    assert frame == profile.Frame("<lambda>", "<frozen importlib._bootstrap>", 1176)
    assert profile.parse_frame("f (a (b)/c.py:3)") == profile.Frame("f", "a (b)/c.py", 3)


def test_one_threads_samples_by_layer_and_by_function() -> None:
    stacks = profile.thread_stacks(RAW, 100)
    assert sum(stacks.values()) == 30 + 10 + 8 + 2 + 4  # not thread 1000, nor 10 (a prefix of 100)
    layers = profile.samples_by(stacks, profile.layer)
    assert layers == {
        "event loop (uvloop's C code, asyncio)": 30,
        "preprocessing and scores (contract, numpy)": 12,
        "uvicorn (HTTP parsing, writes)": 8,
        profile.OTHER: 4,
    }
    functions = profile.samples_by(stacks, profile.function)
    assert functions["PlainJpeg.decode (contract/jpeg.py)"] == 12  # lines of one function summed
    rows = profile.table(layers, ms_per_request=0.54)
    assert (
        rows[2] == f"| event loop (uvloop's C code, asyncio) | {100 * 30 / 54:.1f} % | {0.54 * 30 / 54:.3f} |"
    )
    assert len(profile.table(functions, 1.0, top=2)) == 4


def test_thread_cpu_is_read_per_thread() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        before = thread_cpu_seconds(os.getpid())
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            after = thread_cpu_seconds(os.getpid())
            if after.get(worker.native_id, 0.0) - before.get(worker.native_id, 0.0) >= 0.05:
                break
            time.sleep(0.02)
    finally:
        stop.set()
        worker.join()
    assert os.getpid() in before  # the main thread's id is the process id
    assert after[worker.native_id] - before[worker.native_id] >= 0.05


def test_real_py_spy_output_is_read(tmp_path: Path) -> None:
    """py-spy samples a process it starts (no ptrace rights over others needed); its main
    thread's stacks hold the function it spent its time in."""
    spy = profile.py_spy()
    assert spy is not None, "py-spy is part of the dev install"
    code = "\n".join(
        [
            "import os, time",
            "print(f'pid={os.getpid()}', flush=True)",
            "def spin():",
            "    t = time.time()",
            "    while time.time() - t < 1.5:",
            "        pass",
            "spin()",
        ]
    )
    out = tmp_path / "raw.txt"
    cmd = [spy, "record", "--format", "raw", "--threads", "--rate", "100", "--output", str(out)]
    done = subprocess.run(
        [*cmd, "--", sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pid = int(re.search(r"^pid=(\d+)$", done.stdout, re.M).group(1))  # type: ignore[union-attr]
    functions = profile.samples_by(profile.thread_stacks(out.read_text(), pid), profile.function)
    assert functions["spin (<string>)"] >= 50
