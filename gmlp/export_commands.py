"""`gmlp export`."""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.formats import DEFAULT_EXPORT_VARIANTS, DEFAULT_GRAPH_TOP_K, VARIANTS


def _variants(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown}; choose from {','.join(VARIANTS)}")
    return variants


def _top_k(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--top-k takes a whole number >= 0, got {text!r}")
    return value


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
    p.add_argument(
        "--top-k",
        type=_top_k,
        default=DEFAULT_GRAPH_TOP_K,
        help="K of the graph's topk_ids/topk_scores outputs (at most the vocabulary or classes; "
        f"default {DEFAULT_GRAPH_TOP_K}); 0 exports logits alone",
    )
    p.set_defaults(handler=export)
    p = sub.add_parser(
        "inline",
        help="write a served variant with its SGU function nodes inlined, for runtimes that know no ONNX "
        "local functions (TensorRT, OpenVINO's tools)",
    )
    p.add_argument("served", type=Path, help="served-model directory")
    p.add_argument("--variant", choices=VARIANTS, default="fp32", help="variant to write (default fp32)")
    p.add_argument("--out", type=Path, required=True, help="file to write, or a folder to write it in")
    p.set_defaults(handler=inline)


def export(args: argparse.Namespace) -> int:
    from export import export_served_model

    reports = export_served_model(
        args.checkpoint,
        args.out,
        args.variants,
        name=args.name,
        calibration=args.calibration,
        calibration_samples=args.calibration_samples,
        top_k=args.top_k,
    )
    for report in reports.values():
        print(f"verified {report}")
    print(f"wrote {args.out}")
    return 0


def inline(args: argparse.Namespace) -> int:
    from export.other_runtimes import write_inlined

    print(f"wrote {write_inlined(args.served, args.variant, args.out)}")
    return 0
