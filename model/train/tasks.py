"""The demo models' training tasks (batches, losses) and the runs that train, evaluate and write
each checkpoint; the loop both share is `loop.train_loop`.

CIFAR-10 classifier: gMLPs have no convolutional prior, so on 50,000 images they live on
augmentation and many epochs. The default model is narrow (d=128, d_ffn=512, 10 blocks, 1.05M
parameters) rather than wide, because at a budget of an hour on two CPU cores passes over the data
are worth more than width; random erasing and stochastic depth narrow the gap between training and
test accuracy. The recipes compared at that budget, and their scores, are in the model card
(checkpoints/cifar10-gmlp/README.md).

Gutenberg masked LM, BERT masking over full windows and short padded sentences: the service sends
one short sentence, `[CLS] ... [SEP]` padded to n; the padding is removed from the spatial mixing,
but W's rows for late positions and the model's sense of "sentence ends here" are only learnt if
such inputs are seen in training, hence `short_frac` of every batch. A short row costs as much as a
full window but carries a sixth of its masked tokens, so the share is kept small (the recipes
compared are in the model card).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from contract.calibration import write_calibration_set
from contract.formats import MLM_TASK, VISION_TASK
from model import GMLPMaskedLMConfig, build_model, get_config, save_checkpoint

from .data import (
    CIFAR_MEAN,
    CIFAR_STD,
    SpecialIds,
    TokenCorpus,
    augment_crop_flip,
    full_window,
    load_cifar,
    load_corpus,
    mask_tokens,
    random_erase,
    short_window,
    to_pixel_values,
)
from .evaluate import evaluate_classifier, evaluate_mlm, finish_run, open_predictor
from .loop import loop_config_from_args, train_loop

log = logging.getLogger(__name__)

PREPROCESSING = {
    "crop_size": 32,
    "resize_size": 32,
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": list(CIFAR_MEAN),
    "std": list(CIFAR_STD),
}


@dataclass
class CifarTask:
    """Batches of augmented training images; epoch e visits a permutation seeded by (seed, e)."""

    images: np.ndarray
    labels: np.ndarray
    batch_size: int
    seed: int
    label_smoothing: float = 0.1
    erase_prob: float = 0.0

    @property
    def steps_per_epoch(self) -> int:
        return max(len(self.labels) // self.batch_size, 1)

    def make_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.labels))
        idx = order[index * self.batch_size : (index + 1) * self.batch_size]
        rng = np.random.default_rng([self.seed, 1_000_003, step])
        images = augment_crop_flip(self.images[idx], rng)
        if self.erase_prob > 0:
            images = random_erase(images, rng, self.erase_prob)
        x = to_pixel_values(images, CIFAR_MEAN, CIFAR_STD)
        return torch.from_numpy(x), torch.from_numpy(self.labels[idx])

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
        x, y = batch
        logits = model(x).float()
        loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
        correct = float((logits.detach().argmax(-1) == y).sum())
        return loss, {"acc": (correct, float(len(y)))}


def train_vision(args: Any) -> dict[str, Any]:
    """Train, evaluate on the 10,000 test images and write the checkpoint; returns the run summary."""
    torch.manual_seed(args.seed)
    cache = Path(args.cache_dir)
    images, labels, classes = load_cifar(args.data, "train", limit=args.limit_train, cache_dir=cache)
    config = get_config(
        "gmlp_cifar_p4",
        depth=args.depth,
        d_model=args.d_model,
        d_ffn=args.d_ffn,
        drop_path_rate=args.drop_path,
        num_classes=len(classes),
    )
    model = build_model(config)
    task = CifarTask(images, labels, args.batch_size, args.seed, args.label_smoothing, args.random_erase)
    max_steps = args.max_steps
    if args.epochs is not None:
        epoch_steps = int(args.epochs * task.steps_per_epoch)
        max_steps = epoch_steps if max_steps is None else min(max_steps, epoch_steps)
    log.info("model: %s, %s parameters", config, f"{sum(p.numel() for p in model.parameters()):,}")
    result = train_loop(model, task, loop_config_from_args(args, "cifar10", max_steps=max_steps))
    out = save_checkpoint(
        model, args.out, labels=classes, preprocessing=dict(PREPROCESSING), name=Path(args.out).name
    )
    write_calibration_set(out, VISION_TASK, Path(args.data))  # training images, for int8
    scores = evaluate_classifier(open_predictor(out), Path(args.data), args.limit_eval, cache)
    return finish_run(
        out,
        args,
        result,
        {"cifar10_test": scores},
        data=f"CIFAR-10 train split ({len(labels):,} images), test split for evaluation",
        epochs=result.steps / task.steps_per_epoch,
    )


@dataclass
class MLMTask:
    """Each batch: round(short_frac * B) short padded sentences, the rest full n-token windows.

    No defaults here: `gmlp train-mlm`'s flags are the one place the demo run's values live."""

    corpus: TokenCorpus
    short_pool: np.ndarray
    special: SpecialIds
    n: int
    batch_size: int
    max_predictions: int
    seed: int
    short_frac: float

    def make_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        n_short = int(round(self.short_frac * self.batch_size)) if len(self.short_pool) else 0
        rows = [
            short_window(self.corpus, int(i), self.n, self.special)
            for i in rng.choice(self.short_pool, n_short)
        ]
        starts = rng.integers(0, self.corpus.num_sentences, self.batch_size - n_short)
        rows += [full_window(self.corpus, int(i), self.n, self.special) for i in starts]
        ids, positions, labels = mask_tokens(np.stack(rows), rng, self.special, self.max_predictions)
        return torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(labels)

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
        ids, positions, labels = batch
        logits = model(ids, positions=positions).float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        used = labels >= 0
        correct = float(((logits.detach().argmax(-1) == labels) & used).sum())
        return loss, {"acc": (correct, float(used.sum()))}


def corpus_files(corpus_dir: Path) -> tuple[list[Path], Path]:
    """Training shards and the held-out shard; valid-000 is never trained on."""
    train = sorted(Path(corpus_dir).glob("train-*.txt.gz"))
    valid = Path(corpus_dir) / "valid-000.txt.gz"
    if not train or not valid.is_file():
        raise FileNotFoundError(f"{corpus_dir} lacks train-*.txt.gz or valid-000.txt.gz")
    return train, valid


def train_mlm(args: Any) -> dict[str, Any]:
    """Train, evaluate on held-out text and write the checkpoint; returns the run summary."""
    torch.manual_seed(args.seed)
    cache = Path(args.cache_dir)
    special = SpecialIds.from_tokenizer(args.tokenizer)
    train_files, valid_file = corpus_files(args.corpus)
    corpus = load_corpus(train_files, args.tokenizer, cache, max_sentences=args.limit_train)
    n = args.n
    max_pred = max(args.max_predictions, int(round(0.15 * (n - 2))))
    config = GMLPMaskedLMConfig(
        depth=args.depth,
        d_model=args.d_model,
        d_ffn=args.d_ffn,
        drop_path_rate=args.drop_path,
        attn_dim=args.attn_dim or None,
        vocab_size=special.vocab_size,
        n=n,
        pad_token_id=special.pad,
        mask_token_id=special.mask,
        max_predictions=max_pred,
    )
    model = build_model(config)
    short_pool = corpus.short_sentences(max_tokens=n - 2)
    task = MLMTask(corpus, short_pool, special, n, args.batch_size, max_pred, args.seed, args.short_frac)
    log.info("corpus: %s tokens, %s sentences", f"{len(corpus.ids):,}", f"{corpus.num_sentences:,}")
    log.info("model: %s, %s parameters", config, f"{sum(p.numel() for p in model.parameters()):,}")
    result = train_loop(model, task, loop_config_from_args(args, "mlm", betas=(0.9, 0.98)))
    out = save_checkpoint(model, args.out, tokenizer=args.tokenizer, name=Path(args.out).name)
    write_calibration_set(out, MLM_TASK, train_files[0])  # training prose, for static int8
    valid = load_corpus([valid_file], args.tokenizer, cache, max_sentences=args.limit_valid_sentences)
    scores = evaluate_mlm(open_predictor(out), valid, windows=args.eval_windows, short=args.eval_short)
    tokens_seen = result.steps * args.batch_size * n
    return finish_run(
        out,
        args,
        result,
        {"heldout_valid_000": scores},
        data=f"Gutenberg {len(train_files)} train shards ({len(corpus.ids):,} tokens); valid-000 held out",
        epochs=tokens_seen / max(len(corpus.ids), 1),
    )
