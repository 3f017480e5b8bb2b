"""Benchmark record: what HTTP serving costs against a raw ORT session, and what dynamic batching buys.

    .venv/bin/python -m benchmarks.loadtest_compare --model-repository models [--out compare.md]
    make bench-compare                    # the same on the demo models (make demo-models)

(a) Saturation throughput of POST /classify (many closed-loop users, batching on) against a raw
    `onnxruntime.InferenceSession` on the same variant, thread count and already preprocessed
    images, at the batch size the server actually formed: the ratio is the serving efficiency
    (HTTP, JPEG decoding, preprocessing, queueing, JSON).
(b) The same server at a fixed concurrency with dynamic batching on (max_batch_size=B) and off
    (max_batch_size=1): throughput ratio and p95.

The program starts the server itself (`gmlp serve` on 127.0.0.1, a free port) once per setting
and stops it; every phase is bounded in time. Locust runs on the same machine as the server, so
the HTTP figures include the load generator's share of the CPUs: compare ratios, not absolute
numbers, across machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import command_line, cpu_line, gmlp_serve
from contract.errors import UserError
from contract.formats import VARIANTS, VISION_TASK
from contract.image import ImageTransform
from contract.spec import discover
from loadtests.metrics_scrape import get_json
from loadtests.runner import SweepConfig, parse_duration, run_step
from loadtests.workload import load_images
from service.engine.runtime import OnnxModel, RuntimeOptions

DEFAULT_WORK_DIR = Path("loadtest-report-compare")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model-repository", type=Path, required=True, help="served-model repository to start")
    p.add_argument("--model", default=None, help="classifier to measure (default: the server's default)")
    p.add_argument("--variant", default="fp32", choices=VARIANTS,
                   help="variant to serve and to run raw (default fp32; a dynamically quantised int8 "
                   "runs rows one at a time in the server, so batching cannot help it)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=16, help="max_batch_size with batching on (default 16)")
    p.add_argument("--users", type=int, default=32, help="concurrency of the on/off comparison (default 32)")
    p.add_argument("--saturation-users", type=int, default=64, help="concurrency for (a) (default 64)")
    p.add_argument("--duration", default="20s", help="length of each locust run (default 20s)")
    p.add_argument("--raw-seconds", type=float, default=3.0, help="timed seconds per raw ORT batch size")
    p.add_argument("--out", type=Path, default=None, help="also write the markdown to this file")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="server logs and locust files")
    return p


def _preprocessed_images(spec: Any, count: int) -> Any:
    """The CIFAR-10 test JPEGs through the served model's own transform: float32 [count, 3, H, W]."""
    transform = ImageTransform.for_model(spec.config, 40_000_000)
    images, _ = load_images()
    return np.stack([transform(data) for data in images[:count]])


def raw_ort_throughput(
    model_path: Path, pixels: Any, batch_sizes: list[int], threads: int, min_seconds: float
) -> dict[int, float]:
    """Images/s of a bare ORT session, built by the service's own runtime class, at each batch size."""
    session = OnnxModel(model_path, RuntimeOptions("cpu", threads, spinning=False)).session
    name = session.get_inputs()[0].name
    rates = {}
    for batch in batch_sizes:
        # 8 different batches, cycled: not one array the caches get to know.
        feeds = [
            {name: np.ascontiguousarray(pixels[np.arange(i * batch, (i + 1) * batch) % len(pixels)])}
            for i in range(8)
        ]
        session.run(None, feeds[0])  # warm-up: arena growth for this shape
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_seconds:
            session.run(None, feeds[done % len(feeds)])
            done += 1
        rates[batch] = done * batch / (time.perf_counter() - start)
    return rates


def _locust_step(url: str, users: int, args: argparse.Namespace, work: Path, model: str) -> Any:
    env = {
        "GMLP_LOADTEST_CLASSIFY_WEIGHT": "1",
        "GMLP_LOADTEST_FILL_MASK_WEIGHT": "0",
        "GMLP_LOADTEST_CLASSIFY_MODEL": model,
    }
    config = SweepConfig(url=url, users=[users], duration=args.duration, out_dir=work, env=env)
    return run_step(config, users)


def _server_info(url: str, model: str | None) -> dict[str, Any]:
    listing = get_json(f"{url}/models")
    name = model or listing["defaults"].get(VISION_TASK)
    for info in listing["models"]:
        if info["name"] == name:
            return info
    raise UserError(
        f"the server has no classifier {name!r} (serves {[m['name'] for m in listing['models']]})"
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def run(args: argparse.Namespace) -> int:
    """Run both comparisons, print (and optionally write) the markdown; 1 if any request failed."""
    parse_duration(args.duration)
    if args.batch_size < 2:
        raise UserError("--batch-size must be >= 2 to compare batching on and off")
    specs = discover(args.model_repository)
    work = args.work_dir
    serve_on = ["--variant", args.variant, "--max-batch-size", str(args.batch_size)]
    serve_off = ["--variant", args.variant, "--max-batch-size", "1"]

    with gmlp_serve(
        args.model_repository, log_path=work / "server-batching-on.log", serve_args=serve_on
    ) as srv:
        info = _server_info(srv.url, args.model)
        saturation = _locust_step(srv.url, args.saturation_users, args, work / "saturation", info["name"])
        on = _locust_step(srv.url, args.users, args, work / "batching-on", info["name"])
    with gmlp_serve(
        args.model_repository, log_path=work / "server-batching-off.log", serve_args=serve_off
    ) as srv:
        off = _locust_step(srv.url, args.users, args, work / "batching-off", info["name"])

    # Raw ORT last, with no server running: it gets the whole machine, as the server did.
    spec = specs[info["name"]]
    pixels = _preprocessed_images(spec, 256)
    formed = saturation.batch_all.mean if saturation.batch_all and saturation.batch_all.mean else 1.0
    # int8 (dynamic quantisation) graphs run one row per session call in the server.
    same_batch = max(1, round(formed)) if info.get("rows_batched", True) else 1
    sizes = sorted({1, same_batch, args.batch_size})
    raw = raw_ort_throughput(
        spec.variant_path(info["variant"]), pixels, sizes, int(info["intra_op_threads"]), args.raw_seconds
    )

    http_rps = saturation.total.rps if saturation.total else 0.0
    failures = saturation.failures + on.failures + off.failures
    lines = [
        f"# Serving benchmark: {info['name']} "
        f"({info['variant']}, {info['intra_op_threads']} intra-op threads)",
        "",
        f"- {datetime.now(UTC).isoformat(timespec='seconds')}, {os.cpu_count()} CPUs visible, "
        f"locust on the same machine; {args.duration} per locust run; CIFAR-10 test JPEGs (32x32)",
        f"- {cpu_line()}",
        f"- repository: `{args.model_repository}`; failed requests in all runs: {failures}",
        "",
        "## (a) HTTP saturation throughput vs raw ONNX Runtime",
        "",
        "| path | batch size | images/s |",
        "|---|---:|---:|",
        *(f"| raw ORT session (preprocessed inputs) | {b} | {raw[b]:,.0f} |" for b in sizes),
        f"| HTTP POST /classify, {args.saturation_users} users, max batch {args.batch_size} | "
        f"{formed:.2f} (mean formed) | {http_rps:,.0f} |",
        "",
        f"**HTTP / raw ORT at batch {same_batch}: {http_rps / raw[same_batch]:.2f}** "
        f"(HTTP p95 {_ms(saturation.total.p95_ms if saturation.total else None)} ms)"
        + ("" if info.get("rows_batched", True) else "; this variant runs rows one at a time in the server"),
        "",
        f"## (b) Dynamic batching on vs off, {args.users} users",
        "",
        "| batching | max_batch_size | req/s | p50 ms | p95 ms | p99 ms | mean batch | failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, step, size in (("on", on, args.batch_size), ("off", off, 1)):
        t = step.total
        mean = step.batch_all.mean if step.batch_all else None
        lines.append(
            f"| {label} | {size} | {t.rps if t else 0:,.1f} | {_ms(t.p50_ms if t else None)} | "
            f"{_ms(t.p95_ms if t else None)} | {_ms(t.p99_ms if t else None)} | "
            f"{'n/a' if mean is None else f'{mean:.2f}'} | {step.failures} |"
        )
    if on.total and off.total and off.total.rps:
        lines += [
            "",
            f"**throughput on/off: {on.total.rps / off.total.rps:.2f}x; p95 on {_ms(on.total.p95_ms)} ms "
            f"vs off {_ms(off.total.p95_ms)} ms**",
        ]
    lines += ["", f"Locust CSV/HTML and server logs: `{work}`", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(command_line(__doc__))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        print(f"benchmarks.loadtest_compare: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
