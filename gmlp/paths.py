"""Where the `gmlp` commands find their inputs and put their outputs when not told.

Nothing here is derived from where the code is installed: outputs go below the working directory
(`checkpoints/`, `.cache/`, as in a checkout), the full training and evaluation data sets come from
the folder named by `GMLP_SHARED_DATA` (or from the command line), and the one data file the
package itself needs, ImageNet's class list, is package data read through `importlib.resources`.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

# A folder holding the full data sets in this layout (README, "Training the demo models"):
#   cifar10/cifar10-jpeg.npz, gutenberg/{train-*,valid-000}.txt.gz, bert-base-uncased/tokenizer.json
SHARED_DATA_ENV = "GMLP_SHARED_DATA"
CIFAR10 = ("cifar10", "cifar10-jpeg.npz")
GUTENBERG = ("gutenberg",)
BERT_TOKENIZER = ("bert-base-uncased", "tokenizer.json")

# Relative to the working directory: at a checkout's root these are the committed demo checkpoints
# and the ignored cache.
CHECKPOINTS_DIR = Path("checkpoints")
CACHE_DIR = Path(".cache")

# The 1,000 ImageNet-1k class labels in the usual order, {"0": [wnid, name], ...}: what
# `gmlp convert-timm` names an ImageNet head's classes with unless --labels says otherwise.
IMAGENET_CLASS_INDEX: Traversable = resources.files("gmlp") / "data" / "imagenet_class_index.json"


def shared_data(*parts: str) -> Path | None:
    """`$GMLP_SHARED_DATA/<parts>`, or None when the variable is unset (the command then asks for it)."""
    root = os.environ.get(SHARED_DATA_ENV, "").strip()
    return Path(root).expanduser().joinpath(*parts) if root else None
