"""`gmlp convert-timm` and `gmlp info`."""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

import numpy as np

from contract.errors import UserError
from contract.formats import SERVED_FORMAT

from .paths import IMAGENET_CLASS_INDEX


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert-timm", help="convert a timm gMLP checkpoint to a gmlp checkpoint directory")
    p.add_argument("checkpoint", type=Path, help="timm state dict: .pth, .pth.tar, .bin or .safetensors")
    p.add_argument(
        "--arch", default="gmlp_s16_224", help="named config (gmlp_ti16_224, gmlp_s16_224, gmlp_b16_224)"
    )
    p.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="class names: JSON list or ImageNet class index (default: ImageNet-1k's for 1000 classes)",
    )
    p.add_argument("--out", type=Path, required=True, help="output checkpoint directory")
    p.set_defaults(handler=convert_timm)

    p = sub.add_parser("info", help="print a checkpoint's or served model's config, n, parameters and task")
    p.add_argument("path", type=Path, help="checkpoint directory or served-model directory")
    p.set_defaults(handler=info)


def convert_timm(args: argparse.Namespace) -> int:
    from model.checkpoint import read_labels, read_state_dict, save_checkpoint
    from model.timm_import import TIMM_PREPROCESSING, gmlp_from_timm

    state = read_state_dict(args.checkpoint)
    model = gmlp_from_timm(state, args.arch, source=str(args.checkpoint))
    labels: list[str] | None
    if args.labels is None:
        with resources.as_file(IMAGENET_CLASS_INDEX) as labels_path:
            labels = read_labels(labels_path)
    else:
        labels = read_labels(args.labels) if args.labels.is_file() else None
    if labels is None or len(labels) != model.config.num_classes:
        if args.labels is not None:
            raise UserError(
                f"{args.labels} has {labels and len(labels)} labels, the head has {model.config.num_classes}"
            )
        labels = [f"class_{i}" for i in range(model.config.num_classes)]
    save_checkpoint(
        model, args.out, labels=labels, preprocessing=dict(TIMM_PREPROCESSING), name=args.out.name
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out} ({args.arch}, {n_params:,} parameters, {model.config.num_classes} classes)")
    return 0


def info(args: argparse.Namespace) -> int:
    config_path = args.path / "config.json"
    meta = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if meta.get("format") == SERVED_FORMAT:
        return _served_info(args.path, meta)
    from model.checkpoint import load_checkpoint

    model = load_checkpoint(args.path)
    meta = model.checkpoint_info
    n_params = sum(p.numel() for p in model.parameters())
    print(f"name:       {meta.get('name')}")
    print(f"task:       {meta['task']}")
    print(f"n (tokens): {model.config.seq_len}")
    print(f"parameters: {n_params:,}")
    print("config:     " + json.dumps(meta["model"]))
    print("preprocessing: " + json.dumps(meta.get("preprocessing")))
    return 0


def _served_info(path: Path, meta: dict) -> int:
    """A served-model directory: what the service will load (no torch needed)."""
    import onnx

    fp32 = onnx.load(str(path / meta["variants"]["fp32"]))
    floats = [t for t in fp32.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    n_params = sum(int(np.prod(t.dims)) for t in floats)
    print(f"name:       {meta.get('name')} (served model)")
    print(f"task:       {meta['task']}")
    print(f"n (tokens): {meta['seq_len']}")
    print(f"parameters: {n_params:,} (float initializers of the fp32 graph; shared tensors once)")
    print("variants:   " + ", ".join(f"{k}={v}" for k, v in meta["variants"].items()))
    if "int8_quantization" in meta:
        print(f"int8:       {meta['int8_quantization']} quantisation")
    print("config:     " + json.dumps(meta["model"]))
    print("inputs:     " + json.dumps(meta["inputs"]))
    print("outputs:    " + json.dumps(meta["outputs"]))
    return 0
