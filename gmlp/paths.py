"""Where the repository's own data lives (the demo checkpoints, ../shared/data beside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

from contract.formats import REPO_ROOT

SHARED_DATA = Path(os.environ.get("GMLP_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
DEFAULT_IMAGENET_LABELS = SHARED_DATA / "imagenet" / "imagenet_class_index.json"
BERT_TOKENIZER = SHARED_DATA / "bert-base-uncased" / "tokenizer.json"
CIFAR10_NPZ = SHARED_DATA / "cifar10" / "cifar10-jpeg.npz"
GUTENBERG_DIR = SHARED_DATA / "gutenberg"
CHECKPOINTS_DIR = REPO_ROOT / "checkpoints"
