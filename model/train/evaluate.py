"""Evaluation of a checkpoint (PyTorch) or a served-model directory (ONNX Runtime, any variant),
and the model cards that report it.

Both paths go through the same `Predictor` interface and the same metric code, so the figures
for `model.onnx` / `model.int8.onnx` are directly comparable with the PyTorch checkpoint's.
MLM accuracy is measured the way the service is used: every selected position is replaced by
[MASK]. The 80/10/10 corruption of training, which lets the model see 10% of the answers, is
scored separately as `full_bert_masking` (the figure BERT-style training logs report).

Model cards are regenerable from `training.json` + the weights: `finish_run` records the run
(command, wall time, results) in `training.json` beside the checkpoint; `write_card` turns that
into README.md, so a card can be rebuilt after re-evaluating (`gmlp model-card DIR`) without
retraining. For the MLM it shows live fill-mask predictions.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from safetensors import SafetensorError

from contract.errors import UserError
from contract.formats import MLM_TASK, SERVED_FORMAT, VARIANT_FILES
from contract.json_file import read_json_object
from contract.spec import read_spec
from contract.text import FillMaskCodec
from model.checkpoint import load_checkpoint, read_checkpoint_config
from model.sizes import header_shapes

from .data import SpecialIds, TokenCorpus, full_window, load_cifar, mask_tokens, short_window, to_pixel_values
from .loop import precision_label

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
    model = load_checkpoint(root)

    @torch.inference_mode()
    def run(*inputs: np.ndarray) -> np.ndarray:  # (pixels) or (ids, positions)
        return model(*map(torch.from_numpy, inputs)).float().numpy()

    return run, run


def _onnx_runs(root: Path, info: dict[str, Any], variant: str, threads: int) -> tuple[Vision, MaskedLM]:
    variants = info.get("variants") or {"fp32": VARIANT_FILES["fp32"]}
    if variant not in variants:
        raise UserError(f"{root} has no {variant!r} variant; it has {sorted(variants)}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    providers = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"] if variant == "fp16" else ["CPUExecutionProvider"]
    )
    available = set(ort.get_available_providers())
    try:
        session = ort.InferenceSession(
            str(root / variants[variant]), opts, providers=[p for p in providers if p in available]
        )
    except Exception as exc:  # onnxruntime's own types (InvalidProtobuf, Fail...) for a bad file
        raise UserError(f"{root / variants[variant]} cannot be loaded: {exc}") from None
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
    info = read_json_object(cfg)
    served = info.get("format") == SERVED_FORMAT
    if served:  # checked as the service checks it (SpecError, one line, when malformed)
        spec = read_spec(root)
        assert spec is not None, "its config.json declares the served format"
        info = spec.config
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
    budget = max(int(model_cfg.get("max_predictions", 16)), int(round(0.15 * (n - 2))))
    full = eval_windows(corpus, n, special, windows, short=False)
    out: dict[str, Any] = {
        "full": mlm_accuracy(pred.mlm, full, special, budget),
        "full_bert_masking": mlm_accuracy(pred.mlm, full, special, budget, bert_mix=True),
    }
    if short:
        out["short"] = mlm_accuracy(
            pred.mlm, eval_windows(corpus, n, special, short, short=True), special, budget
        )
    return out


TRAINING_FILE = "training.json"

# The flags of either trainer that the card records (those a trainer lacks are left out).
HYPERPARAMETERS = (
    "batch_size lr weight_decay warmup_steps label_smoothing short_frac drop_path random_erase attn_dim"
)

FILL_MASK_EXAMPLES = [
    "The cat sat on the [MASK].",
    "She opened the [MASK] and walked into the room.",
    "I drink a cup of [MASK] every morning.",
    "He was born in a small [MASK] near the sea.",
    "The sun rises in the [MASK].",
    "We went to the [MASK] to buy some bread.",
    "My brother is a [MASK] at the local school.",
    "It was a cold and [MASK] night.",
    "They [MASK] all day and were tired in the evening.",
    "The children were playing in the [MASK] after dinner.",
]


def finish_run(
    out: Path, args: Any, result: Any, results: dict[str, Any], data: str, epochs: float
) -> dict[str, Any]:
    """Write training.json and README.md next to the checkpoint; return the summary."""
    argv = sys.argv[1:]
    command = "gmlp " + shlex.join(argv) if argv and argv[0].startswith("train") else shlex.join(sys.argv)
    summary = {
        "command": command,
        "data": data,
        "steps": result.steps,
        "epochs": round(epochs, 2),
        "train_wall_time_s": round(result.train_seconds, 1),
        "threads": getattr(args, "threads", None),
        "precision": result.precision,
        "hyperparameters": {k: getattr(args, k) for k in HYPERPARAMETERS.split() if hasattr(args, k)},
        "final_train_metrics": result.metrics,
        "results": results,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (Path(out) / TRAINING_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    write_card(out)
    return summary


def fill_mask_examples(pred: Predictor) -> list[dict[str, Any]]:
    """The top-5 predictions for each [MASK] of `FILL_MASK_EXAMPLES`, encoded by the service's own
    codec and run through `pred` (a checkpoint or an exported ONNX variant)."""
    codec = FillMaskCodec(pred.root / "tokenizer.json", pred.info["model"])
    rows = []
    for sentence in FILL_MASK_EXAMPLES:
        enc = codec.encode(sentence)
        logits = pred.mlm(enc.feeds["input_ids"][None], enc.feeds["mask_positions"][None])[0]
        slots = codec.decode(enc, logits, top_k=5)  # the service's own softmax and ranking
        preds = [[(p["token_str"], round(p["score"], 3)) for p in slot] for slot in slots]
        rows.append({"sentence": sentence, "predictions": preds})
    return rows


def record_served_eval(
    checkpoint: Path, variant: str, command: str, results: dict[str, Any], pred: Predictor
) -> None:
    """Store `gmlp eval`'s figures for an exported variant in the checkpoint's training.json (with,
    for a masked LM, the fill-mask examples as that variant answers them) and rewrite the card."""
    path = Path(checkpoint) / TRAINING_FILE
    train = read_json_object(path) if path.is_file() else {}
    entry: dict[str, Any] = {"command": command, "results": results}
    if pred.task == MLM_TASK:
        entry["fill_mask_examples"] = fill_mask_examples(pred)
    train.setdefault("served", {})[variant] = entry
    path.write_text(json.dumps(train, indent=2) + "\n")
    write_card(checkpoint)


def write_card(root: str | Path) -> Path:
    """(Re)write README.md from config.json, training.json and, for the MLM, live predictions."""
    root = Path(root)
    info, config = read_checkpoint_config(root)
    train = read_json_object(root / TRAINING_FILE) if (root / TRAINING_FILE).is_file() else {}
    cfg = config.to_dict()
    weights = root / "model.safetensors"
    try:
        n_params = sum(math.prod(shape) for shape in header_shapes(weights).values())
    except (SafetensorError, OSError) as exc:
        raise UserError(f"{weights} is not a readable safetensors file: {exc}") from None
    is_mlm = info["task"] == MLM_TASK
    served = train.get("served", {})
    lines = [
        f"# {info.get('name', root.name)}",
        "",
        f"gMLP ({'masked language model' if is_mlm else 'image classifier'}, Liu et al. 2021, "
        '"Pay Attention to MLPs") trained from scratch on a 2-core CPU as a demo model for gmlp-serve.',
        "",
        "## Model",
        f"- task: `{info['task']}`, n = {config.seq_len} tokens"
        + (" (32x32 image, 4x4 patches)" if not is_mlm else " (WordPiece, BERT uncased vocabulary)"),
        f"- depth {cfg['depth']}, d_model {cfg['d_model']}, d_ffn {cfg['d_ffn']}, "
        + (f"aMLP tiny attention of size {cfg['attn_dim']}" if cfg.get("attn_dim") else "no tiny attention"),
        f"- parameters: {n_params:,}; model.safetensors {weights.stat().st_size / 1e6:.1f} MB (fp32)",
        f"- preprocessing: `{json.dumps(info.get('preprocessing'))}`",
        "",
        "## Training",
        f"- data: {train.get('data', 'n/a')}",
        f"- command: `{train.get('command', 'n/a')}`",
        f"- steps: {train.get('steps', 'n/a')} ({train.get('epochs', 'n/a')} epochs), "
        f"wall time {train.get('train_wall_time_s', 0) / 60:.1f} min on "
        # A training.json without `precision` records a run trained under bf16 autocast.
        f"{train.get('threads', '?')} CPU thread(s), {train.get('precision', precision_label(bf16=True))}",
        f"- hyperparameters: `{json.dumps(train.get('hyperparameters', {}))}`",
        *[f"- note: {note}" for note in train.get("notes", [])],
        "",
        "## Results",
        "```json",
        json.dumps(train.get("results", {}), indent=2),
        "```",
    ]
    if is_mlm:
        lines += [
            "",
            "Masked-token accuracy on `valid-000.txt.gz` (never trained on): 15% of the tokens of each "
            "window (at least one) are replaced by [MASK] with a fixed seed; `full` = full 128-token "
            "windows, `short` = single sentences of 5-40 words padded to n (what the service is sent). "
            "`full_bert_masking` scores the same full windows corrupted as in training (of the chosen "
            "15%: 80% [MASK], 10% a random token, 10% unchanged), the figure BERT-style pre-training "
            "logs usually report; it is easier, because the unchanged tokens are mostly copied.",
            "",
        ]
        source = next((v for v in ("int8", "fp32") if "fill_mask_examples" in served.get(v, {})), None)
        if source:
            examples = served[source]["fill_mask_examples"]
            lines += ["", f"## Fill-mask examples (top-5, as the served {source} ONNX model answers)", ""]
        else:
            examples = fill_mask_examples(open_predictor(root))
            lines += ["", "## Fill-mask examples (top-5, PyTorch checkpoint)", ""]
        for ex in examples:
            preds = "; ".join(", ".join(f"{t} ({p:.2f})" for t, p in slot) for slot in ex["predictions"])
            lines.append(f"- `{ex['sentence']}` -> {preds}")
        limitations = [
            "Trained for about an hour on ~12M tokens of 19th-century public-domain books: modern "
            "vocabulary and facts are poorly covered, and predictions are often generic (the, a, was).",
            f"Fixed window of n = {info['seq_len']} tokens; longer inputs must be truncated.",
            "No fine-tuning, no safety filtering; a demo of the serving stack, not a general-purpose LM.",
        ]
    else:
        lines += ["", "Top-1 on the 10,000 CIFAR-10 test images (JPEG-decoded, no test-time augmentation)."]
        limitations = [
            "Only 32x32 RGB inputs of the 10 CIFAR-10 classes; other images are squeezed to 32x32 and "
            "forced into one of the 10 classes.",
            "Trained on JPEG (quality ~75) copies of CIFAR-10; accuracy is well below convolutional "
            "networks of the same size.",
        ]
    if served:  # the exported variants' figures, each with the `gmlp eval` command behind it
        lines += ["", "## Served model (exported ONNX)"]
        for entry in served.values():
            lines += ["", f"`{entry['command']}`:", "```json", json.dumps(entry["results"]), "```"]
    lines += ["", "## Limitations", *[f"- {item}" for item in limitations], ""]
    path = root / "README.md"
    path.write_text("\n".join(lines))
    return path
