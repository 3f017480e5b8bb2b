"""What every benchmark program shares: free ports, server processes, the machine's CPU facts,
medians and the command line's timing options.

One way to start a server: `ServerProcess` (from `gmlp.server_process`, which `gmlp tune`
shares) runs any server command on 127.0.0.1 in its own session, waits until a probe succeeds
(GET /health/ready by default, or a real answer), and stops its whole process tree.
`gmlp_serve` builds the one for `gmlp serve`. Every figure a benchmark prints comes with
`cpu_line()` (model name, vCPUs, SIMD flags), since int8 and bf16 speed depend on them. Only the
standard library, `benchmarks.proc`, `gmlp.paths` and `gmlp.server_process` (all standard library
only) are imported here: the GPU check runs the benchmarks from a virtual environment that has
just the serving install.

The benchmarks run from a checkout (the wheel does not ship them): `REPO` is where they find the
committed checkpoints and test data.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from gmlp.paths import cifar10_npz
from gmlp.server_process import (
    HOST,
    ServerProcess,
    free_port,
    gmlp_serve,
    http_get,
    link_repository,
    serve_argv,
)

REPO = Path(__file__).resolve().parents[1]
# The lscpu flags that decide int8 and bf16 speed (AVX2, AVX-512, VNNI, BF16, AMX, FMA, F16C).
SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "vnni", "sse4_2")

T = TypeVar("T")


def cpu_facts() -> dict[str, str]:
    """Python version, CPU model name, vCPUs, hypervisor, the SIMD flags and all flags (lscpu;
    /proc/cpuinfo where lscpu is missing)."""
    info = {"python": platform.python_version()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = _cpuinfo_as_lscpu()
    fields = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in text.splitlines() if ":" in ln)}
    flags = fields.get("Flags", "").split()
    info.update(
        cpu=fields.get("Model name", "?"),
        cpus=fields.get("CPU(s)", str(os.cpu_count() or "?")),
        hypervisor=fields.get("Hypervisor vendor", "none"),
        simd=" ".join(f for f in flags if f.startswith(SIMD_PREFIXES)),
        flags=" ".join(flags),
    )
    return info


def _cpuinfo_as_lscpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    first = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in text.splitlines() if ":" in ln)}
    return f"Model name: {first.get('model name', '?')}\nFlags: {first.get('flags', '')}\n"


def cpu_line(facts: Mapping[str, str] | None = None) -> str:
    """One line saying which machine a table came from."""
    f = cpu_facts() if facts is None else facts
    guest = "" if f.get("hypervisor", "none") == "none" else f", {f['hypervisor']} guest"
    simd = f.get("simd") or "none of " + ", ".join(SIMD_PREFIXES)
    return f"CPU: {f.get('cpu', '?')}, {f.get('cpus', '?')} vCPUs{guest}; SIMD: {simd}; Python {f['python']}"


def interleaved_ms(variants: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per call of each variant, timing them in turn (A, B, A, B, ...) after one warm-up
    call each, so that drift in the machine's speed hits all of them alike."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}


def median_rate(
    fn: Callable[[], object], items: int, *, repeats: int, min_seconds: float, warmups: int = 1
) -> float:
    """Items per second of `fn` (`items` per call): the median over `repeats` timed runs, each of
    as many calls as fill `min_seconds` (at least one), after `warmups` untimed calls."""
    for _ in range(warmups):
        fn()
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(calls * items / elapsed)
    return statistics.median(rates)


def command_line(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line; `--help` shows its whole docstring (what it measures, the command)."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_timing_arguments(p: argparse.ArgumentParser, repeats: int, threads: int = 2) -> None:
    """`--threads` (for torch and ONNX Runtime) and `--repeats` (timed runs behind each median)."""
    p.add_argument("--threads", type=int, default=threads, help=f"threads (default {threads})")
    p.add_argument("--repeats", type=int, default=repeats, help=f"timed runs per median (default {repeats})")


def add_cifar_argument(p: argparse.ArgumentParser) -> None:
    """`--cifar`: the full CIFAR-10 npz, by default from $GMLP_SHARED_DATA; required without it."""
    default = cifar10_npz()
    p.add_argument(
        "--cifar",
        type=Path,
        default=default,
        required=default is None,
        help="cifar10-jpeg.npz of the full CIFAR-10 data set (default: from $GMLP_SHARED_DATA)",
    )


__all__ = [
    "HOST",
    "REPO",
    "add_cifar_argument",
    "add_timing_arguments",
    "command_line",
    "cpu_facts",
    "cpu_line",
    "free_port",
    "gmlp_serve",
    "http_get",
    "interleaved_ms",
    "link_repository",
    "median_rate",
    "serve_argv",
    "ServerProcess",
]
