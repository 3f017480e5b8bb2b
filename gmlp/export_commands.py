"""`gmlp export` and `gmlp bench`."""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.formats import DEFAULT_EXPORT_VARIANTS, VARIANTS


def _variants(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown}; choose from {','.join(VARIANTS)}")
    return variants


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to a verified ONNX served-model directory")
    p.add_argument("checkpoint", type=Path, help="checkpoint directory (model.safetensors + config.json)")
    p.add_argument("--out", type=Path, required=True, help="served-model directory to write")
    p.add_argument(
        "--variants",
        type=_variants,
        default=list(DEFAULT_EXPORT_VARIANTS),
        help=f"comma list of {','.join(VARIANTS)} (default {','.join(DEFAULT_EXPORT_VARIANTS)})",
    )
    p.add_argument("--name", default=None, help="model name in the service (default: the --out folder name)")
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="representative inputs for static int8 (batchable): a folder or CIFAR-style .npz of images, "
        "or a .txt/.txt.gz of prose for a masked LM; without it int8 is dynamically quantised",
    )
    p.add_argument("--calibration-samples", type=int, default=256, help="calibration inputs to use")
    p.set_defaults(handler=export)

    p = sub.add_parser("bench", help="model-level throughput: PyTorch eager/bf16 vs ORT plain/fused/int8")
    p.add_argument(
        "path", help="checkpoint directory, served-model directory, or a named config (gmlp_s16_224)"
    )
    p.add_argument("--batches", type=_ints, default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    p.add_argument("--threads", type=int, default=0, help="threads for torch and ORT (0: all CPUs)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="minimum time per timed run")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as markdown here")
    p.set_defaults(handler=bench)


def export(args: argparse.Namespace) -> int:
    from export import export_served_model

    reports = export_served_model(
        args.checkpoint,
        args.out,
        args.variants,
        name=args.name,
        calibration=args.calibration,
        calibration_samples=args.calibration_samples,
    )
    for report in reports.values():
        print(f"verified {report}")
    print(f"wrote {args.out}")
    return 0


def bench(args: argparse.Namespace) -> int:
    from export.bench import run_bench

    table = run_bench(
        args.path, args.batches, repeats=args.repeats, threads=args.threads, min_seconds=args.min_seconds
    )
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0
