"""`gmlp convert-timm`, `gmlp convert-lucidrains`, `gmlp info`, `gmlp export` and `gmlp inline`.

The converters write a checkpoint directory, which `gmlp export` then turns into a served model.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

import numpy as np

from contract.errors import UserError
from contract.formats import DEFAULT_EXPORT_VARIANTS, DEFAULT_GRAPH_TOP_K, SERVED_FORMAT, VARIANTS
from contract.json_file import read_json_object

from .paths import IMAGENET_CLASS_INDEX

IMAGENET_CLASSES = 1000  # a head of this size is named with ImageNet-1k's labels by default


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
    p = sub.add_parser("convert-timm", help="convert a timm gMLP checkpoint to a gmlp checkpoint directory")
    p.add_argument("checkpoint", type=Path, help="timm state dict: .pth, .pth.tar, .bin or .safetensors")
    p.add_argument(
        "--arch", default="gmlp_s16_224", help="named config (gmlp_ti16_224, gmlp_s16_224, gmlp_b16_224)"
    )
    p.add_argument(
        "--labels",
        type=Path,
        help="class names: JSON list or ImageNet class index (default: ImageNet-1k's for 1000 classes)",
    )
    p.add_argument("--out", type=Path, required=True, help="output checkpoint directory")
    p.set_defaults(handler=convert_timm)

    p = sub.add_parser(
        "convert-lucidrains",
        help="convert a g-mlp-pytorch (lucidrains) gMLPVision or gMLP to a gmlp checkpoint directory",
    )
    p.add_argument("checkpoint", type=Path, help="its state_dict: .pt, .pth, .bin or .safetensors")
    p.add_argument(
        "--config",
        type=Path,
        required=True,
        help="JSON object of the constructor's arguments (image_size: gMLPVision, else gMLP)",
    )
    p.add_argument("--out", type=Path, required=True, help="output checkpoint directory")
    p.add_argument("--labels", type=Path, help="classifier: class names (JSON list or index)")
    p.add_argument("--tokenizer", type=Path, help="language model: its tokenizers JSON file")
    p.set_defaults(handler=convert_lucidrains)

    p = sub.add_parser("info", help="print a checkpoint's or served model's config, n, parameters and task")
    p.add_argument("path", type=Path, help="checkpoint directory or served-model directory")
    p.set_defaults(handler=info)

    p = sub.add_parser("export", help="export a checkpoint to a verified ONNX served-model directory")
    p.add_argument("checkpoint", type=Path, help="checkpoint directory (model.safetensors + config.json)")
    p.add_argument("--out", type=Path, required=True, help="served-model directory to write")
    p.add_argument(
        "--variants",
        type=_variants,
        default=list(DEFAULT_EXPORT_VARIANTS),
        help=f"comma list of {','.join(VARIANTS)} (default {','.join(DEFAULT_EXPORT_VARIANTS)})",
    )
    p.add_argument("--name", help="model name in the service (default: the --out folder name)")
    p.add_argument(
        "--calibration",
        type=Path,
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


def _labels(given: Path | None, count: int, imagenet: bool = False) -> list[str]:
    """The head's class names from `given` (a JSON list or class index), one per class; without
    it ImageNet-1k's for a 1000-class head when `imagenet` (timm's weights), else `class_<i>`."""
    from model.checkpoint import read_labels

    if given is None and imagenet and count == IMAGENET_CLASSES:
        with resources.as_file(IMAGENET_CLASS_INDEX) as labels_path:
            return read_labels(labels_path)
    if given is None:
        return [f"class_{i}" for i in range(count)]
    labels = read_labels(given)
    if len(labels) != count:
        raise UserError(f"{given} has {len(labels)} labels, the head has {count}")
    return labels


def convert_timm(args: argparse.Namespace) -> None:
    from model.checkpoint import TIMM_PREPROCESSING, gmlp_from_timm, read_state_dict, save_checkpoint

    state = read_state_dict(args.checkpoint)
    model = gmlp_from_timm(state, args.arch, source=str(args.checkpoint))
    count = model.config.num_classes
    labels = _labels(args.labels, count, imagenet=True)
    save_checkpoint(
        model, args.out, labels=labels, preprocessing=dict(TIMM_PREPROCESSING), name=args.out.name
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out} ({args.arch}, {n_params:,} parameters, {count} classes)")


def convert_lucidrains(args: argparse.Namespace) -> None:
    from model.checkpoint import read_state_dict, save_checkpoint
    from model.lucidrains_import import gmlp_from_lucidrains
    from model.train.data import SpecialIds

    constructor = read_json_object(args.config)  # the constructor's arguments
    vision = "image_size" in constructor
    wrong = "--tokenizer" if vision and args.tokenizer else "--labels" if not vision and args.labels else None
    if wrong:
        raise UserError(f"{wrong} does not apply to a {'gMLPVision' if vision else 'gMLP language model'}")
    ids: dict[str, int] = {}
    if not vision:
        if args.tokenizer is None:
            raise UserError("a gMLP language model needs --tokenizer (its tokenizers JSON file)")
        special = SpecialIds.from_tokenizer(args.tokenizer)
        num_tokens = constructor.get("num_tokens")
        if isinstance(num_tokens, int) and special.vocab_size != num_tokens:
            raise UserError(f"{args.tokenizer} has {special.vocab_size} tokens, num_tokens is {num_tokens}")
        ids = {"pad_token_id": special.pad, "mask_token_id": special.mask}
    state = read_state_dict(args.checkpoint)
    model = gmlp_from_lucidrains(constructor, state, str(args.checkpoint), **ids)
    config = model.config
    labels = _labels(args.labels, config.num_classes) if vision else None  # type: ignore[union-attr]
    save_checkpoint(model, args.out, labels=labels, tokenizer=args.tokenizer, name=args.out.name)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out} ({config.task}, n = {config.seq_len}, {n_params:,} parameters)")


def info(args: argparse.Namespace) -> None:
    config_path = args.path / "config.json"
    meta = read_json_object(config_path) if config_path.is_file() else {}
    if meta.get("format") == SERVED_FORMAT:
        _served_info(args.path)
        return
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


def _served_info(path: Path) -> None:
    """A served-model directory: what the service will load (no torch needed)."""
    import onnx

    from contract.spec import read_spec

    spec = read_spec(path)  # checked as the service checks it (SpecError: a one-line reason)
    assert spec is not None, "info() saw the served format in its config.json"
    if "fp32" not in spec.variants:
        raise UserError(f"{path}: no fp32 variant, whose parameters info counts")
    try:
        fp32 = onnx.load(str(spec.variant_path("fp32")))
    except Exception as exc:  # protobuf's DecodeError, and others, for a file that is no model
        raise UserError(f"{spec.variant_path('fp32')} is not a readable ONNX model: {exc}") from None
    floats = [t for t in fp32.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    n_params = sum(int(np.prod(t.dims)) for t in floats)
    meta = spec.config
    print(f"name:       {spec.name} (served model)")
    print(f"task:       {spec.task}")
    print(f"n (tokens): {spec.seq_len}")
    print(f"parameters: {n_params:,} (float initializers of the fp32 graph; shared tensors once)")
    print("variants:   " + ", ".join(f"{k}={v}" for k, v in spec.variants.items()))
    if "int8_quantization" in meta:
        print(f"int8:       {meta['int8_quantization']} quantisation")
    print("config:     " + json.dumps(spec.model_config))
    print("inputs:     " + json.dumps(spec.inputs))
    print("outputs:    " + json.dumps(spec.outputs))


def export(args: argparse.Namespace) -> None:
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


def inline(args: argparse.Namespace) -> None:
    from export.verify import write_inlined

    print(f"wrote {write_inlined(args.served, args.variant, args.out)}")
