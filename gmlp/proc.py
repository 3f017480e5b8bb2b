"""Server CPU time and process trees, from psutil: a process and all its descendants.

Servers differ in how many processes they start (LitServe's inference worker, Ray's raylet, GCS,
controller, proxy and replica, BentoML's arbiter and worker), so CPU is taken over the whole tree
rooted at the process the benchmark started. A measurement reads the tree before and after the
load; the difference over the requests served is the server's CPU cost per request, whichever
process spent it. Processes that exit between the two reads take their time with them. The same
tree tells `gmlp.server_process.ServerProcess` what to stop.
"""

from __future__ import annotations

import contextlib
import resource

import psutil


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
