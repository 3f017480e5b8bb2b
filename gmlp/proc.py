"""Server CPU time from /proc: utime + stime summed over a process and all its descendants.

Servers differ in how many processes they start (LitServe's inference worker, Ray's raylet, GCS,
controller, proxy and replica, BentoML's arbiter and worker), so CPU is taken over the whole tree
rooted at the process the benchmark started. A measurement reads the tree before and after the
load; the difference over the requests served is the server's CPU cost per request, whichever
process spent it. Processes that exit between the two reads take their time with them. The same
tree tells `gmlp.server_process.ServerProcess` what to stop. Standard library only.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def parse_stat(text: str) -> tuple[int, int, int]:
    """(ppid, utime, stime) in clock ticks from the text of /proc/<pid>/stat."""
    rest = _after_name(text)
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    return int(rest[1]), int(rest[11]), int(rest[12])


def parse_state(text: str) -> str:
    """The state letter (R, S, D, Z...) from the text of /proc/<pid>/stat."""
    return _after_name(text)[0]


def _after_name(text: str) -> list[str]:
    """The fields after the command name, which is in parentheses and may hold spaces or
    parentheses itself: counted from the *last* closing parenthesis."""
    return text[text.rindex(")") + 2 :].split()


def _all_stats(directory: Path = PROC) -> dict[int, tuple[int, int, int]]:
    """(ppid, utime, stime) of every process in `directory` (/proc), or every thread in a
    process's task/ directory, by id."""
    stats = {}
    for entry in directory.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we were reading
    return stats


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process whose parent chain leads to it."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in tree:
            continue
        tree.add(pid)
        stack.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root: int, proc: Path = PROC) -> float:
    """CPU seconds (user + system) spent so far by `root` and its living descendants."""
    stats = _all_stats(proc)
    tree = descendants(root, {pid: s[0] for pid, s in stats.items()})
    ticks = sum(stats[pid][1] + stats[pid][2] for pid in tree if pid in stats)
    return ticks / CLOCK_TICKS


def machine_busy_seconds(proc: Path = PROC) -> float:
    """CPU seconds the whole machine has been busy (all CPUs; steal counted as busy: the host
    took that time from us). Minus the server's and wrk's share, it is the background load."""
    fields = (proc / "stat").read_text().splitlines()[0].split()
    assert fields[0] == "cpu"
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def reaped_children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have ended and been waited for (the load
    generator's, read around one run of it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_pids(root: int, proc: Path = PROC) -> set[int]:
    """The living processes of the tree (to stop every one of them after a peer's rows)."""
    stats = _all_stats(proc)
    return descendants(root, {pid: s[0] for pid, s in stats.items()}) & set(stats)


def alive(pid: int, proc: Path = PROC) -> bool:
    """Whether `pid` is a living process (a zombie, ended but not yet reaped, is not)."""
    try:
        state = parse_state((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return False
    return state != "Z"


def thread_cpu_seconds(pid: int, proc: Path = PROC) -> dict[int, float]:
    """CPU seconds (user + system) spent so far by each living thread of process `pid`, by thread
    id; the main thread's id is `pid` itself."""
    stats = _all_stats(proc / str(pid) / "task")
    return {tid: (utime + stime) / CLOCK_TICKS for tid, (_, utime, stime) in stats.items()}
