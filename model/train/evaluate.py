"""Evaluation of a checkpoint (PyTorch) or a served-model directory (ONNX Runtime, any variant).

Both paths go through the same `Predictor` interface and the same metric code, so the figures
for `model.onnx` / `model.int8.onnx` are directly comparable with the PyTorch checkpoint's.
MLM accuracy is measured the way the service is used: every selected position is replaced by
[MASK]. The 80/10/10 corruption of training, which lets the model see 10% of the answers, is
scored separately as `full_bert_masking` (the figure BERT-style training logs report).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import UserError
from contract.formats import SERVED_FORMAT, VARIANT_FILES

from .data import SpecialIds, TokenCorpus, full_window, load_cifar, mask_tokens, short_window, to_pixel_values

EVAL_SEED = 1234


Vision = Callable[[np.ndarray], np.ndarray]
MaskedLM = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class Predictor:
    """A model behind plain numpy calls: `vision(pixels)` -> logits or `mlm(ids, positions)` -> logits."""

    task: str
    info: dict[str, Any]  # the directory's config.json
    root: Path
    vision: Vision
    mlm: MaskedLM


def _torch_runs(root: Path) -> tuple[Vision, MaskedLM]:
    import torch

    from model.checkpoint import load_checkpoint

    model = load_checkpoint(root)

    def run(fn: Callable[[], torch.Tensor]) -> np.ndarray:
        with torch.inference_mode():
            return fn().float().numpy()

    return (
        lambda x: run(lambda: model(torch.from_numpy(x))),
        lambda ids, pos: run(lambda: model(torch.from_numpy(ids), positions=torch.from_numpy(pos))),
    )


def _onnx_runs(root: Path, info: dict[str, Any], variant: str, threads: int) -> tuple[Vision, MaskedLM]:
    import onnxruntime as ort

    variants = info.get("variants") or {"fp32": VARIANT_FILES["fp32"]}
    if variant not in variants:
        raise UserError(f"{root} has no {variant!r} variant; it has {sorted(variants)}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    providers = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"] if variant == "fp16" else ["CPUExecutionProvider"]
    )
    available = set(ort.get_available_providers())
    session = ort.InferenceSession(
        str(root / variants[variant]), opts, providers=[p for p in providers if p in available]
    )
    max_pred = int(info.get("model", {}).get("max_predictions") or info.get("max_predictions") or 16)

    def mlm(ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # The graph decodes `max_predictions` slots; more positions go through in several calls.
        parts = []
        for start in range(0, positions.shape[1], max_pred):
            chunk = positions[:, start : start + max_pred]
            width = chunk.shape[1]
            if width < max_pred:
                chunk = np.pad(chunk, ((0, 0), (0, max_pred - width)))
            out = session.run(None, {"input_ids": ids, "mask_positions": chunk})[0]
            parts.append(out[:, :width])
        return np.concatenate(parts, axis=1)

    return lambda x: session.run(None, {"pixel_values": x})[0], mlm


def open_predictor(path: str | Path, variant: str = "fp32", threads: int = 1) -> Predictor:
    """A checkpoint directory (format gmlp-checkpoint) or a served model (gmlp-served-model)."""
    root = Path(path)
    cfg = root / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"{root} has no config.json (expected a checkpoint or served-model directory)"
        )
    info = json.loads(cfg.read_text())
    served = info.get("format") == SERVED_FORMAT
    runs = _onnx_runs(root, info, variant, threads) if served else _torch_runs(root)
    return Predictor(info["task"], info, root, *runs)


def evaluate_classifier(
    pred: Predictor, npz: Path, limit: int | None, cache_dir: Path | None, batch: int = 250
) -> dict[str, float]:
    """CIFAR-10 test top-1 with the directory's own preprocessing (identity resize at 32x32)."""
    pre = pred.info.get("preprocessing") or {}
    if pre.get("crop_size", 32) != 32 or pre.get("resize_size", 32) != 32:
        raise UserError(
            f"{pred.root} expects {pre.get('crop_size')}px inputs; CIFAR-10 evaluation needs 32px"
        )
    images, labels, _ = load_cifar(npz, "test", limit=limit, cache_dir=cache_dir)
    correct = 0
    for start in range(0, len(labels), batch):
        x = to_pixel_values(images[start : start + batch], tuple(pre["mean"]), tuple(pre["std"]))
        correct += int((pred.vision(x).argmax(-1) == labels[start : start + batch]).sum())
    return {"top1": round(correct / len(labels), 4), "images": len(labels)}


def mlm_accuracy(
    predict: Callable[[np.ndarray, np.ndarray], np.ndarray],
    windows: np.ndarray,
    special: SpecialIds,
    max_predictions: int,
    seed: int = EVAL_SEED,
    batch: int = 64,
    bert_mix: bool = False,
) -> dict[str, float]:
    """Masked-token top-1 / top-5 over `windows` [N, n]: every selected position set to [MASK]
    (what a fill-mask user sends), or with `bert_mix` corrupted 80/10/10 as in training."""
    rng = np.random.default_rng(seed)
    top1 = top5 = total = 0
    for start in range(0, len(windows), batch):
        ids, positions, labels = mask_tokens(
            windows[start : start + batch], rng, special, max_predictions, bert_mix=bert_mix
        )
        logits = predict(ids, positions)
        used = labels >= 0
        best5 = np.argpartition(-logits, 5, axis=-1)[..., :5]
        top1 += int(((logits.argmax(-1) == labels) & used).sum())
        top5 += int(((best5 == labels[..., None]).any(-1) & used).sum())
        total += int(used.sum())
    return {"top1": round(top1 / max(total, 1), 4), "top5": round(top5 / max(total, 1), 4), "tokens": total}


def eval_windows(
    corpus: TokenCorpus, n: int, special: SpecialIds, count: int, short: bool, seed: int = EVAL_SEED
) -> np.ndarray:
    """Fixed evaluation windows: consecutive non-overlapping full windows, or random short sentences."""
    if short:
        pool = corpus.short_sentences(max_tokens=n - 2)
        chosen = np.random.default_rng(seed).choice(pool, size=min(count, len(pool)), replace=False)
        return np.stack([short_window(corpus, int(i), n, special) for i in np.sort(chosen)])
    starts, next_free = [], 0
    for i in range(corpus.num_sentences):
        if corpus.offsets[i] >= next_free and corpus.offsets[i] + n - 2 <= len(corpus.ids):
            starts.append(i)
            next_free = corpus.offsets[i] + n - 2
            if len(starts) == count:
                break
    return np.stack([full_window(corpus, i, n, special) for i in starts])


def evaluate_mlm(pred: Predictor, corpus: TokenCorpus, windows: int, short: int) -> dict[str, Any]:
    """Top-1/top-5 on `windows` full 128-token windows and on `short` padded single sentences."""
    model_cfg = pred.info["model"]
    n = int(model_cfg["n"])
    special = SpecialIds.from_tokenizer(pred.root / "tokenizer.json")
    max_pred = int(model_cfg.get("max_predictions", 16))
    full_budget = max(max_pred, int(round(0.15 * (n - 2))))
    out: dict[str, Any] = {}
    mlm = pred.mlm
    full = eval_windows(corpus, n, special, windows, short=False)
    out["full"] = mlm_accuracy(mlm, full, special, full_budget)
    out["full_bert_masking"] = mlm_accuracy(mlm, full, special, full_budget, bert_mix=True)
    if short:
        out["short"] = mlm_accuracy(
            mlm, eval_windows(corpus, n, special, short, short=True), special, full_budget
        )
    return out
