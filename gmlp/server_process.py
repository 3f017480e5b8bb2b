"""A server as a child process on 127.0.0.1: started in its own session, probed until ready,
stopped with its whole process tree; and the CPU time of process trees and threads (psutil).

`ServerProcess` runs any server command; `gmlp_serve` builds the one for `gmlp serve` (`gmlp
tune` starts its candidates with it, the benchmark programs their servers). Servers differ in how
many processes they start (Ray's raylet, GCS, controller, proxy and replica; BentoML's arbiter and
worker), so both the stop signals and the CPU time go to the whole tree rooted at the process
started: CPU read before and after a load, over the requests served, is the server's cost per
request, whichever process spent it. Standard library, psutil and the load tests' HTTP GET only:
it runs wherever the serving install does.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import psutil

from loadtests.runner import get_json as get_json  # for the programs that start servers here
from loadtests.runner import http_get

HOST = "127.0.0.1"

T = TypeVar("T")


def _tree(root: int) -> list[psutil.Process]:
    """`root` and its living descendants ([] when `root` has ended)."""
    try:
        process = psutil.Process(root)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) spent so far by `root` and its living descendants."""
    total = 0.0
    for process in _tree(root):
        with contextlib.suppress(psutil.NoSuchProcess):  # exited while we were reading
            times = process.cpu_times()
            total += times.user + times.system
    return total


def tree_pids(root: int) -> set[int]:
    """The living processes of the tree (to stop every one of them after a peer's rows)."""
    return {process.pid for process in _tree(root)}


def alive(pid: int) -> bool:
    """Whether `pid` is a living process (a zombie, ended but not yet reaped, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all CPUs; steal counted as busy: the host
    took that time from us). Minus the server's and wrk's share, it is the background load."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def reaped_children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have ended and been waited for (the load
    generator's, read around one run of it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) spent so far by each living thread of process `pid`, by thread
    id; the main thread's id is `pid` itself."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def link_repository(work: Path, model_dir: Path) -> Path:
    """`work/repository`, a model repository holding `model_dir` as a link: a server started on it
    serves exactly that model, whatever else lies beside it."""
    repository = work / "repository"
    repository.mkdir(parents=True, exist_ok=True)
    link = repository / model_dir.name
    if not link.exists():
        link.symlink_to(model_dir.resolve())
    return repository


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
        return http_get(f"{self.base_url}/health/ready", timeout_s=2.0)

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
                if not pids:  # the root may have died after poll(): reap it now
                    self.proc.wait(timeout=grace_s)
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
    path: str = "",
    cwd: Path | None = None,
) -> ServerProcess:
    """A `ServerProcess` of `gmlp serve` on a free port (not started yet), its `url` ending in `path`;
    `cwd`: another checkout of the project, whose code it then runs (`python -m` imports from there)."""
    port = free_port()
    argv = serve_argv(repository, port, *serve_args)
    return ServerProcess(
        argv, port=port, log_path=log_path, path=path, env=env, ready_timeout_s=ready_timeout_s, cwd=cwd
    )
