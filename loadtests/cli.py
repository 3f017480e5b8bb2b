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
from datetime import UTC, datetime
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(f"GMLP_LOADTEST_{name}") or default


def register(sub: argparse._SubParsersAction) -> None:
    """Add `loadtest` to the `gmlp` console script (gmlp/cli.py)."""
    p = sub.add_parser(
        "loadtest",
        help="load-test a running service with locust at several concurrency levels; write a report",
        description="Run locust headless once per user count against --url and write report.md, "
        "report.png, results.json and each step's CSV/HTML into --out. Exits 1 if any request failed.",
    )
    p.add_argument(
        "--url",
        default=_env("URL", "http://127.0.0.1:8000"),
        help="base URL of the service [env GMLP_LOADTEST_URL; default %(default)s]",
    )
    p.add_argument(
        "--users",
        default=_env("USERS", "1,4,16,64"),
        help="comma-separated concurrent user counts, one step each [env GMLP_LOADTEST_USERS; %(default)s]",
    )
    p.add_argument(
        "--duration",
        default=_env("DURATION", "30s"),
        help="length of each step, e.g. 30s, 2m [env GMLP_LOADTEST_DURATION; %(default)s]",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(_env("OUT", "loadtest-report")),
        help="output directory [env GMLP_LOADTEST_OUT; %(default)s]",
    )
    p.add_argument(
        "--spawn-rate", type=float, default=None, help="users started per second (default: all in one second)"
    )
    p.add_argument(
        "--classify-weight",
        type=int,
        default=None,
        help="relative weight of /classify requests [env GMLP_LOADTEST_CLASSIFY_WEIGHT; default 1]",
    )
    p.add_argument(
        "--fill-mask-weight",
        type=int,
        default=None,
        help="relative weight of /fill-mask requests [env GMLP_LOADTEST_FILL_MASK_WEIGHT; default 1]",
    )
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even if requests failed")
    p.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for /health/ready (default 60)"
    )
    p.set_defaults(handler=run_loadtest)


def _workload_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.classify_weight is not None:
        env["GMLP_LOADTEST_CLASSIFY_WEIGHT"] = str(args.classify_weight)
    if args.fill_mask_weight is not None:
        env["GMLP_LOADTEST_FILL_MASK_WEIGHT"] = str(args.fill_mask_weight)
    return env


def run_loadtest(args: argparse.Namespace) -> int:
    """Handler of `gmlp loadtest`: sweep, report, exit status 1 on any failed request."""
    from loadtests.report import build_results, summary_table, write_report
    from loadtests.runner import (
        SweepConfig,
        describe_server,
        parse_duration,
        parse_users,
        run_sweep,
        wait_ready,
    )
    from loadtests.workload import LoadConfig

    users = parse_users(args.users)
    parse_duration(args.duration)
    env = _workload_env(args)
    config = LoadConfig.from_env({**os.environ, **env})  # fail here, not in N locust processes
    for name, path in (
        ("CIFAR", config.cifar_path),
        ("TEXT", config.text_path),
        ("TOKENIZER", config.tokenizer_path),
    ):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"GMLP_LOADTEST_{name}={path} does not exist")
    try:
        wait_ready(args.url, args.ready_timeout)
    except TimeoutError as exc:
        print(f"gmlp loadtest: {exc}", file=sys.stderr)
        return 1
    models = describe_server(args.url)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    sweep = SweepConfig(
        url=args.url,
        users=users,
        duration=args.duration,
        out_dir=args.out,
        spawn_rate=args.spawn_rate,
        env=env,
    )
    steps = run_sweep(sweep)
    workload = {
        "duration": args.duration,
        "spawn_rate": args.spawn_rate,
        "classify_weight": config.classify_weight,
        "fill_mask_weight": config.fill_mask_weight,
        "top_k": config.top_k,
        "upload": config.upload,
    }
    results = build_results(
        url=args.url,
        steps=steps,
        models=models,
        workload=workload,
        started=started,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
    )
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
