"""What every benchmark program shares: free ports, server processes, the machine's CPU facts,
medians and the command line's timing options.

One way to start a server: `ServerProcess` runs any server command on 127.0.0.1 in its own
session (process group), waits until a probe succeeds (GET /health/ready by default, or a real
answer), and stops its whole process tree (SIGTERM, then SIGKILL), since some frameworks leave
helpers behind a plain kill of the root. `gmlp_serve` builds the one for `gmlp serve`.
Every figure a benchmark prints comes with `cpu_line()` (model name, vCPUs, SIMD flags), since
int8 and bf16 speed depend on them. Only the standard library, `benchmarks.proc` and `gmlp.paths`
(both standard library only) are imported here: the GPU check runs the benchmarks from a virtual
environment that has just the serving install.

The benchmarks run from a checkout (the wheel does not ship them): `REPO` is where they find the
committed checkpoints and test data.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from benchmarks.proc import alive, tree_pids
from gmlp.paths import cifar10_npz

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
# The lscpu flags that decide int8 and bf16 speed (AVX2, AVX-512, VNNI, BF16, AMX, FMA, F16C).
SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "vnni", "sse4_2")

T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def link_repository(work: Path, model_dir: Path) -> Path:
    """`work/repository`, a model repository holding `model_dir` as a link: a server started on it
    serves exactly that model, whatever else lies beside it."""
    repository = work / "repository"
    repository.mkdir(exist_ok=True)
    link = repository / model_dir.name
    if not link.exists():
        link.symlink_to(model_dir.resolve())
    return repository


def http_get(url: str, timeout_s: float = 2.0) -> bytes:
    """The body of a GET that answered 2xx (urllib raises OSError subclasses otherwise)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


class ServerProcess:
    """A server child process on 127.0.0.1; as a context manager it is started and ready inside.

    `argv` is the whole command; `url` is `http://127.0.0.1:PORT` plus `path` (the URL measured).
    The output goes to `log_path`; `log_tail()` shows it when the server dies or never gets ready.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log_path: Path,
        path: str = "",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready_timeout_s: float = 90.0,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.base_url = f"http://{HOST}:{port}"
        self.url = self.base_url + path
        self.log_path = log_path
        self.env = dict(env or {})
        self.cwd = cwd
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> None:
        """Start the command in its own session; the log file is the child's stdout and stderr."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def health(self) -> bytes:
        """GET /health/ready: the default readiness probe (raises until the server is ready)."""
        return http_get(f"{self.base_url}/health/ready")

    def wait_ready(self, probe: Callable[[], T], timeout_s: float | None = None) -> T:
        """Call `probe` until it returns (an OSError, ValueError or KeyError means "not yet");
        return what it returned. Fails early (RuntimeError) if the process exits, late
        (TimeoutError) if it never answers."""
        assert self.proc is not None, "not started"
        limit = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited with {self.proc.returncode} before it was ready "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            try:
                return probe()
            except (OSError, ValueError, KeyError) as exc:  # not listening, not ready, no answer yet
                last = exc
                time.sleep(0.25)
        raise TimeoutError(
            f"{self.argv[0]} was not ready within {limit:.0f} s ({last}; {self.log_path}):\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every process of the tree (a server drains), SIGKILL what is left after `grace_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return  # never started, or ended and reaped: its pid may belong to another process now
        pids = tree_pids(self.proc.pid) | {self.proc.pid}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the root, so that it does not linger as a zombie
                pids = {pid for pid in pids if alive(pid)}
                if not pids:
                    return
                time.sleep(0.1)

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_ready(self.health)
        except BaseException:
            self.stop()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_argv(repository: Path, port: int, *flags: str) -> list[str]:
    """`gmlp serve` of exactly `repository` (no start-up export of checkpoints into it), HTTP only
    on `port` (a fixed gRPC port would clash between servers on one machine)."""
    return [
        *(sys.executable, "-m", "gmlp", "serve", "--host", HOST, "--port", str(port)),
        *("--model-repository", str(repository), "--checkpoint-dir", "", "--grpc-port", "0"),
        *flags,
    ]


def gmlp_serve(
    repository: Path,
    *,
    log_path: Path,
    serve_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 90.0,
) -> ServerProcess:
    """A `ServerProcess` of `gmlp serve` on a free port (not started yet)."""
    port = free_port()
    return ServerProcess(
        serve_argv(repository, port, *serve_args),
        port=port,
        log_path=log_path,
        env=env,
        ready_timeout_s=ready_timeout_s,
    )


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
