"""`gmlp train-vision`, `gmlp train-mlm`, `gmlp eval` and `gmlp model-card`.

Defaults are the demo models' settings: each run is sized to finish (train + evaluate + write the
checkpoint) within about an hour on two CPU cores (`--threads 2`).
torch is imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.cpu import PRECISIONS
from contract.errors import UserError
from contract.formats import SERVED_FORMAT, VARIANTS, VISION_TASK

from .paths import (
    BERT_TOKENIZER,
    CACHE_DIR,
    CHECKPOINTS_DIR,
    CIFAR10,
    GUTENBERG,
    SHARED_DATA_ENV,
    shared_data,
)


def _common(p: argparse.ArgumentParser, **defaults: Any) -> None:
    """The options both trainers take; `defaults` are the model's own (its `set_defaults`)."""
    p.add_argument("--out", type=Path, help="checkpoint directory to write")
    p.add_argument("--depth", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--d-ffn", type=int)
    p.add_argument("--drop-path", type=float, default=0.0, help="stochastic depth rate")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps")
    p.add_argument(
        "--time-budget-min",
        type=float,
        default=60.0,
        help="whole run (training + final evaluation) in minutes; the cosine is planned to end in it "
        "(default 60, the demo models' budget)",
    )
    p.add_argument(
        "--eval-reserve-s",
        type=float,
        help="seconds of the budget kept for the final evaluation and checkpoint",
    )
    p.add_argument("--limit-train", type=int, help="use only the first N training examples")
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="bf16 autocast or fp32; auto (default) takes bf16 only where the CPU has native bf16 "
        "(AVX512-BF16/AMX): elsewhere it is emulated, many times slower than fp32 (docs/benchmarks.md)",
    )
    p.add_argument(
        "--no-bf16", dest="precision", action="store_const", const="fp32", help="same as --precision fp32"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model for training (inductor; needs a C++ compiler, about a minute to "
        "compile); a faster step for the masked LM, none for the small classifier (docs/benchmarks.md)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the saved training state")
    p.add_argument("--state-dir", type=Path, help="training state (default .cache/train/<out name>)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR / "data", help="decoded/tokenised data cache")
    p.set_defaults(**defaults)


def _data_argument(p: argparse.ArgumentParser, flag: str, where: tuple[str, ...], what: str) -> None:
    """A data set flag: by default its place `where` under $GMLP_SHARED_DATA (gmlp/paths.py);
    needed when that is unset."""
    default = shared_data(*where)
    hint = f"needed unless ${SHARED_DATA_ENV} is set" if default is None else f"default {default}"
    p.add_argument(flag, type=Path, default=default, help=f"{what} ({hint})")


def _given(path: Path | None, flag: str) -> Path:
    """A data set the command needs, or the reason why there is none."""
    if path is None:
        raise UserError(f"no data: pass {flag} or set {SHARED_DATA_ENV} to the folder holding the data sets")
    return path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-vision", help="train the CIFAR-10 gMLP classifier (32x32, patch 4, n = 64)")
    _data_argument(p, "--data", CIFAR10, "cifar10-jpeg.npz")
    _common(
        p,
        depth=10,
        d_model=128,
        d_ffn=512,
        batch_size=128,
        lr=2e-3,
        weight_decay=0.05,
        warmup_steps=400,
        out=CHECKPOINTS_DIR / "cifar10-gmlp",
        eval_reserve_s=120,
        drop_path=0.05,
    )
    p.add_argument("--epochs", type=float, help="stop after this many epochs")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--random-erase", type=float, default=0.25, help="probability of random erasing per image")
    p.add_argument("--limit-eval", type=int, help="evaluate on the first N test images")
    p.set_defaults(handler=train_vision)

    p = sub.add_parser("train-mlm", help="train the Gutenberg gMLP masked LM (n = 128, BERT WordPiece)")
    _data_argument(p, "--corpus", GUTENBERG, "folder with train-*.txt.gz, valid-000.txt.gz")
    _data_argument(p, "--tokenizer", BERT_TOKENIZER, "tokenizers JSON (BERT uncased)")
    _common(
        p,
        depth=6,
        d_model=256,
        d_ffn=1024,
        batch_size=48,
        lr=2e-3,
        weight_decay=0.01,
        warmup_steps=200,
        out=CHECKPOINTS_DIR / "gutenberg-gmlp-mlm",
        eval_reserve_s=240,
    )
    p.add_argument(
        "--attn-dim", type=int, default=64, help="aMLP tiny-attention size (paper: 64); 0 for plain gMLP"
    )
    p.add_argument("--n", type=int, default=128, help="window length in tokens")
    p.add_argument("--max-predictions", type=int, default=20, help="masked positions decoded per window")
    p.add_argument("--short-frac", type=float, default=0.1, help="share of short padded sentences per batch")
    p.add_argument(
        "--eval-windows", type=int, default=2000, help="held-out full windows for the final evaluation"
    )
    p.add_argument(
        "--eval-short", type=int, default=2000, help="held-out short sentences for the final evaluation"
    )
    p.add_argument("--limit-valid-sentences", type=int, help=argparse.SUPPRESS)
    p.set_defaults(handler=train_mlm)

    p = sub.add_parser(
        "eval", help="evaluate a checkpoint or served-model directory (CIFAR-10 / held-out MLM)"
    )
    p.add_argument("path", type=Path, help="checkpoint directory or served-model directory")
    p.add_argument("--variant", default="fp32", choices=VARIANTS, help="served-model ONNX variant")
    p.add_argument("--limit", type=int, help="test images, or full windows and short sentences")
    _data_argument(p, "--data", CIFAR10, "cifar10-jpeg.npz (classifier)")
    _data_argument(p, "--corpus", GUTENBERG, "Gutenberg folder (MLM; uses valid-000)")
    p.add_argument("--threads", type=int)
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR / "data")
    p.add_argument(
        "--record",
        type=Path,
        metavar="CHECKPOINT",
        help="store the served model's figures in this checkpoint's training.json and model card",
    )
    p.set_defaults(handler=evaluate)

    p = sub.add_parser("model-card", help="regenerate a trained checkpoint's README.md from training.json")
    p.add_argument("path", type=Path)
    p.set_defaults(handler=model_card)


def _set_threads(threads: int | None) -> None:
    """torch's intra-op threads, when `--threads` gives them (torch is imported only then)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def _train(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict[str, Any]]) -> None:
    """Either trainer, with the threads and training-state folder settled first."""
    _set_threads(args.threads)
    if args.state_dir is None:
        args.state_dir = CACHE_DIR / "train" / Path(args.out).name
    summary = run(args)
    line = {"out": str(args.out), **summary["results"], "train_wall_time_s": summary["train_wall_time_s"]}
    print(json.dumps(line))


def train_vision(args: argparse.Namespace) -> None:
    from model.train.tasks import train_vision as run

    args.data = _given(args.data, "--data CIFAR10_NPZ")
    _train(args, run)


def train_mlm(args: argparse.Namespace) -> None:
    from model.train.tasks import train_mlm as run

    args.corpus = _given(args.corpus, "--corpus GUTENBERG_DIR")
    args.tokenizer = _given(args.tokenizer, "--tokenizer TOKENIZER_JSON")
    _train(args, run)


def evaluate(args: argparse.Namespace) -> None:
    from model.train.evaluate import evaluate_classifier, evaluate_mlm, open_predictor, record_served_eval

    _set_threads(args.threads)
    start = time.monotonic()
    pred = open_predictor(args.path, variant=args.variant, threads=args.threads or 1)
    kind = "onnx" if pred.info.get("format") == SERVED_FORMAT else "pytorch"
    if args.record is not None and kind != "onnx":
        raise SystemExit("--record takes a served-model directory (the exported ONNX) as PATH")
    if pred.task == VISION_TASK:
        data = _given(args.data, "--data CIFAR10_NPZ")
        results = {"cifar10_test": evaluate_classifier(pred, data, args.limit, args.cache_dir)}
    else:
        from model.train.data import load_corpus
        from model.train.tasks import corpus_files

        _, valid = corpus_files(_given(args.corpus, "--corpus GUTENBERG_DIR"))
        count = args.limit or 2000
        corpus = load_corpus([valid], args.path / "tokenizer.json", args.cache_dir)
        results = {"heldout_valid_000": evaluate_mlm(pred, corpus, windows=count, short=count)}
    line: dict[str, Any] = {"path": str(args.path), "task": pred.task, "runtime": kind}
    if kind == "onnx":
        line["variant"] = args.variant
    line |= results | {"seconds": round(time.monotonic() - start, 1)}
    if args.record is not None:
        command = f"gmlp eval {args.path} --variant {args.variant}" + (
            f" --limit {args.limit}" if args.limit else ""
        )
        record_served_eval(args.record, args.variant, command, results, pred)
    print(json.dumps(line))


def model_card(args: argparse.Namespace) -> None:
    from model.train.evaluate import write_card

    print(write_card(args.path))
