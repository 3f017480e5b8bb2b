"""Server CPU time from /proc, as the benchmark programs import it: the functions live in
`gmlp.proc`, which `gmlp tune` shares (the wheel ships it, not this package)."""

from gmlp.proc import (
    CLOCK_TICKS,
    PROC,
    alive,
    descendants,
    machine_busy_seconds,
    parse_stat,
    parse_state,
    reaped_children_cpu_seconds,
    thread_cpu_seconds,
    tree_cpu_seconds,
    tree_pids,
)

__all__ = [
    "CLOCK_TICKS",
    "PROC",
    "alive",
    "descendants",
    "machine_busy_seconds",
    "parse_stat",
    "parse_state",
    "reaped_children_cpu_seconds",
    "thread_cpu_seconds",
    "tree_cpu_seconds",
    "tree_pids",
]
