"""`gmlp loadtest`: a concurrency sweep against a running service, with a report.

Only argparse at import time: `gmlp --help` imports this module in every image. locust and
matplotlib are imported by the handler. Every flag of `gmlp loadtest` also has
a `GMLP_LOADTEST_*` environment default, so a compose service can be configured without a
command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

# Flags with a `GMLP_LOADTEST_*` default: (flag, variable suffix, default, help).
_ENV_FLAGS = (
    ("--url", "URL", "http://127.0.0.1:8000", "base URL of the service"),
    ("--users", "USERS", "1,4,16,64", "comma-separated concurrent user counts, one step each"),
    ("--duration", "DURATION", "30s", "length of each step, e.g. 30s, 2m"),
    ("--out", "OUT", "loadtest-report", "output directory"),
)
_WEIGHTS = ("classify", "fill_mask")  # --classify-weight, --fill-mask-weight


def register(sub: argparse._SubParsersAction) -> None:
    """Add `loadtest` to the `gmlp` console script (gmlp/cli.py)."""
    p = sub.add_parser(
        "loadtest",
        help="load-test a running service with locust at several concurrency levels; write a report",
        description="Run locust headless once per user count against --url and write report.md, "
        "report.png, results.json and each step's CSV/HTML into --out. Exits 1 if any request failed.",
    )
    for flag, name, default, text in _ENV_FLAGS:
        p.add_argument(
            flag,
            type=Path if flag == "--out" else str,
            default=os.environ.get(f"GMLP_LOADTEST_{name}") or default,
            help=f"{text} [env GMLP_LOADTEST_{name}; default %(default)s]",
        )
    p.add_argument("--spawn-rate", type=float, help="users started per second (default: all in one second)")
    for task in _WEIGHTS:
        p.add_argument(
            f"--{task.replace('_', '-')}-weight",
            type=int,
            help=f"relative weight of /{task.replace('_', '-')} requests "
            f"[env GMLP_LOADTEST_{task.upper()}_WEIGHT; default 1]",
        )
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even if requests failed")
    p.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for /health/ready (default 60)"
    )
    p.set_defaults(handler=run_loadtest)


def run_loadtest(args: argparse.Namespace) -> int:
    """Handler of `gmlp loadtest`: sweep, report, exit status 1 on any failed request."""
    from loadtests.report import SCHEMA, summary_table, write_report
    from loadtests.runner import get_json, parse_duration, parse_users, run_step, wait_ready
    from loadtests.workload import LoadConfig

    users = parse_users(args.users)
    parse_duration(args.duration)
    # The weights given as flags, as the environment variables the locustfile reads.
    weights = {task: getattr(args, f"{task}_weight") for task in _WEIGHTS}
    env = {f"GMLP_LOADTEST_{task.upper()}_WEIGHT": str(w) for task, w in weights.items() if w is not None}
    config = LoadConfig.from_env({**os.environ, **env})  # fail here, not in N locust processes
    try:
        wait_ready(args.url, args.ready_timeout)
    except TimeoutError as exc:
        print(f"gmlp loadtest: {exc}", file=sys.stderr)
        return 1
    try:  # the served models' variant, threads and batching settings, for the report's header
        models = list(get_json(f"{args.url.rstrip('/')}/models").get("models", []))
    except (OSError, ValueError, AttributeError):
        models = []  # the report says GET /models was not available
    started = datetime.now(UTC).isoformat(timespec="seconds")
    steps = []
    for i, count in enumerate(users):  # a failing step does not stop the sweep (the report shows it)
        if i:
            time.sleep(1.0)  # let the previous step's queue drain
        steps.append(run_step(args, count, env))
    results = {  # results.json: report.md and report.png are drawn from it alone
        "schema": SCHEMA,
        "url": args.url,
        "started": started,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "workload": {
            "duration": args.duration,
            "spawn_rate": args.spawn_rate,
            "classify_weight": config.classify_weight,
            "fill_mask_weight": config.fill_mask_weight,
            "top_k": config.top_k,
            "upload": config.upload,
        },
        "server_models": models,
        "steps": [step.to_json() for step in steps],
        "total_failures": sum(step.failures for step in steps),
    }
    paths = write_report(args.out, results)
    print("\n".join(summary_table(results["steps"])))
    for step in steps:
        if step.error:
            print(f"  step error: {step.error.splitlines()[0]}", file=sys.stderr)
    print(f"report: {paths['md']}  plot: {paths['png']}  data: {paths['json']}")
    if results["total_failures"] and not args.allow_failures:
        print(
            f"gmlp loadtest: {results['total_failures']} failed requests (see {paths['md']})", file=sys.stderr
        )
        return 1
    return 0
