"""CIFAR-10 gMLP classifier from scratch: crop + flip + random erasing, label smoothing,
stochastic depth, AdamW, cosine.

gMLPs have no convolutional prior, so on 50,000 images they live on augmentation and many epochs.
The default model is narrow (d=128, d_ffn=512, 10 blocks, 1.05M parameters) rather than wide,
because at a budget of an hour on two CPU cores passes over the data are worth more than width;
random erasing and stochastic depth narrow the gap between training and test accuracy. The
recipes compared at that budget, and their scores, are in the model card
(checkpoints/cifar10-gmlp/README.md).
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

from contract.formats import VISION_TASK

from .data import CIFAR_MEAN, CIFAR_STD, augment_crop_flip, load_cifar, random_erase, to_pixel_values
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
    from contract.calibration import write_calibration_set
    from model import build_model, get_config, save_checkpoint

    from .card import finish_run
    from .evaluate import evaluate_classifier, open_predictor

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
    loop_cfg = loop_config_from_args(args, "cifar10", max_steps=max_steps)
    log.info("model: %s, %s parameters", config, f"{sum(p.numel() for p in model.parameters()):,}")
    result = train_loop(model, task, loop_cfg)
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
