"""One measurement of `gmlp tune`: the real server started with a candidate's settings, loaded with
the closed-loop client at each concurrency level, then stopped.

The server is `gmlp serve` in explicit model-control mode with only the tuned model loaded, so
its neighbours in the repository take neither memory nor start-up time. GET /models tells what
the server really ran (instances, threads, variant, provider), which the report shows beside the
candidate. Levels run from the lowest concurrency up; once a level's p99 misses the SLO the
higher ones are skipped (in a closed loop more clients only queue longer), which keeps a hopeless
candidate cheap. The server's CPU time over each level is read from /proc, for the CPU cost per
request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlp.server_process import get_json, gmlp_serve, link_repository, tree_cpu_seconds
from gmlp.tune.space import Candidate, Measured
from loadtests.engine import run_closed_loop, task_requests


@dataclass(frozen=True)
class Plan:
    """How every candidate is measured: the same model, load, windows and SLO."""

    repository: Path
    model: str
    concurrency: tuple[int, ...]
    seconds: float
    warmup_s: float
    slo_p99_ms: float
    work_dir: Path
    serve_args: tuple[str, ...] = ()


def measure(plan: Plan, candidate: Candidate, index: int) -> Measured:
    """Start the server with `candidate`'s settings, load it level by level, stop it."""
    started = time.monotonic()
    result = Measured(candidate)
    server = gmlp_serve(
        link_repository(plan.work_dir, plan.repository / plan.model),  # that model alone
        log_path=plan.work_dir / f"server-{index:03d}.log",
        serve_args=[*candidate.flags(), *plan.serve_args],
        ready_timeout_s=120.0,
    )
    try:
        with server:
            listing = get_json(f"{server.base_url}/models")
            info = next((m for m in listing["models"] if m["name"] == plan.model), None)
            if info is None:
                raise RuntimeError(f"the server does not serve {plan.model}")
            result.served = {
                k: info.get(k)
                for k in ("variant", "instances", "intra_op_threads", "lone_threads", "provider", "task", "n")
            }
            requests = task_requests(info["task"], plan.model, info.get("n"))
            levels: list[dict[str, Any]] = []
            for i, concurrency in enumerate(plan.concurrency):
                if levels and (levels[-1]["p99_ms"] is None or levels[-1]["p99_ms"] > plan.slo_p99_ms):
                    result.skipped = list(plan.concurrency[i:])
                    break
                cpu_before = tree_cpu_seconds(server.pid)
                load = run_closed_loop(
                    server.base_url,
                    requests,
                    concurrency=concurrency,
                    seconds=plan.seconds,
                    warmup_s=plan.warmup_s,
                    max_requests=200_000,
                )
                cpu = tree_cpu_seconds(server.pid) - cpu_before  # over the warm-up and the window
                summary = load.summary()
                summary["server_cpu_ms"] = round(1000 * cpu / load.answered, 3) if load.answered else None
                levels.append(summary)
            result.levels = levels
    except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as exc:
        # A candidate the server refuses (a variant it does not have, settings it cannot run)
        # is reported with the reason and ranked last; the search goes on.
        result.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
    result.seconds = time.monotonic() - started
    return result
