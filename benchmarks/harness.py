"""What every benchmark program shares beside its servers: the machine's CPU facts, a median timer,
the command line, the rewriting of a section of docs/benchmarks.md and the checkout's root
(`REPO`: the wheel does not ship the benchmarks).

Servers, ports and process trees come from `gmlp.server_process` (which `gmlp tune` shares), load
from `loadtests.engine` (or wrk, for the peer benchmark). Every figure comes with `cpu_line()`,
since int8 and bf16 speed depend on the SIMD flags. Standard library only: the GPU check runs the
benchmarks from a virtual environment with just the serving install.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from gmlp.server_process import ServerProcess, gmlp_serve

REPO = Path(__file__).resolve().parents[1]
# The lscpu flags that decide int8 and bf16 speed (AVX2, AVX-512, VNNI, BF16, AMX, FMA, F16C).
SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "vnni", "sse4_2")


def cpu_facts() -> dict[str, str]:
    """Python version, CPU model name, vCPUs, hypervisor, the SIMD flags and all flags (lscpu;
    /proc/cpuinfo where lscpu is missing)."""
    info = {"python": platform.python_version()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        cpuinfo = Path("/proc/cpuinfo")  # the same model name and flags, their keys in lower case
        text = cpuinfo.read_text() if cpuinfo.exists() else ""
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip().lower(): value.strip() for key, value in pairs}
    flags = fields.get("flags", "").split()
    info.update(
        cpu=fields.get("model name", "?"),
        cpus=fields.get("cpu(s)", str(os.cpu_count() or "?")),
        hypervisor=fields.get("hypervisor vendor", "none"),
        simd=" ".join(f for f in flags if f.startswith(SIMD_PREFIXES)),
        flags=" ".join(flags),
    )
    return info


def cpu_line(facts: Mapping[str, str] | None = None) -> str:
    """One line saying which machine a table came from."""
    f = cpu_facts() if facts is None else facts
    guest = "" if f.get("hypervisor", "none") == "none" else f", {f['hypervisor']} guest"
    simd = f.get("simd") or "none of " + ", ".join(SIMD_PREFIXES)
    return f"CPU: {f.get('cpu', '?')}, {f.get('cpus', '?')} vCPUs{guest}; SIMD: {simd}; Python {f['python']}"


def median_seconds(fn: Callable[[], object], seconds: float, warmups: int = 1) -> float:
    """Median seconds per call of `fn` over calls that fill `seconds` (at least 3), after `warmups`
    untimed calls (ORT allocates its arena on the first runs)."""
    for _ in range(warmups):
        fn()
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < stop:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def replace_section(doc: str, section: str, begin: str, end: str, heading: str) -> str:
    """Put `section` between the markers of a markdown document, or append it (with its heading)
    when they are absent: how a program rewrites its section of docs/benchmarks.md."""
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in doc and end in doc:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    return doc.rstrip() + f"\n\n{heading}\n\n{block}\n"


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and each option's default after its help."""


def command_line(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line; `--help` shows its whole docstring (what it measures, the command)
    and the options' defaults."""
    return argparse.ArgumentParser(description=doc, formatter_class=_Help)


def onnxruntime_servers(
    stack: ExitStack,
    repository: Path,
    layouts: Mapping[str, Sequence[str]],
    log_dir: Path,
    prefix: str = "",
    checkouts: Mapping[str, Path] | None = None,
) -> dict[str, ServerProcess]:
    """One `gmlp serve` per layout (its flags), all on `repository` and ONNX Runtime, side by side
    until `stack` closes: what a benchmark that compares layouts in interleaved rounds measures. A
    layout named in `checkouts` runs the code of that checkout (a baseline: an earlier commit)."""
    return {
        name: stack.enter_context(
            gmlp_serve(
                repository,
                log_path=log_dir / f"{prefix}{name}.log",
                serve_args=flags,
                env={"GMLP_BACKEND": "onnxruntime"},
                cwd=(checkouts or {}).get(name),
            )
        )
        for name, flags in layouts.items()
    }
