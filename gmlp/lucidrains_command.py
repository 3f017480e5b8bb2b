"""`gmlp convert-lucidrains`: a g-mlp-pytorch model (its state_dict and constructor arguments) to a
checkpoint directory, which `gmlp export` then turns into a served model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from contract.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--labels", type=Path, default=None, help="classifier: class names (JSON list or index)")
    p.add_argument("--tokenizer", type=Path, default=None, help="language model: its tokenizers JSON file")
    p.set_defaults(handler=convert_lucidrains)


def convert_lucidrains(args: argparse.Namespace) -> int:
    from model.checkpoint import read_labels, read_state_dict, save_checkpoint
    from model.lucidrains_import import gmlp_from_lucidrains
    from model.train.data import SpecialIds

    try:
        constructor = json.loads(args.config.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{args.config} is not valid JSON: {exc}") from exc
    if not isinstance(constructor, dict):
        raise UserError(f"{args.config} must hold a JSON object of constructor arguments")
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
    if vision:
        count = config.num_classes  # type: ignore[union-attr]
        labels = read_labels(args.labels) if args.labels else [f"class_{i}" for i in range(count)]
        if len(labels) != count:
            raise UserError(f"{args.labels} has {len(labels)} labels, the head has {count}")
        save_checkpoint(model, args.out, labels=labels, name=args.out.name)
    else:
        save_checkpoint(model, args.out, tokenizer=args.tokenizer, name=args.out.name)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out} ({config.task}, n = {config.seq_len}, {n_params:,} parameters)")
    return 0
