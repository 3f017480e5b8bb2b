"""Names fixed by the on-disk formats and the API, each defined once (docs/formats.md)."""

from __future__ import annotations

from importlib import metadata
from typing import Literal, get_args

SERVED_FORMAT = "gmlp-served-model"
CHECKPOINT_FORMAT = "gmlp-checkpoint"
# Both directory formats describe themselves in this file.
CONFIG_FILE = "config.json"
# The model card a served directory may hold (`gmlp export` copies the checkpoint's); the service
# shows a summary of it (service/tasks/card.py).
CARD_FILE = "README.md"

VISION_TASK = "image-classification"
MLM_TASK = "fill-mask"
TASKS = (VISION_TASK, MLM_TASK)

# Exported ONNX variants (numeric precisions of one model) and their files in a served directory.
Variant = Literal["fp32", "int8", "fp16"]
VARIANTS: tuple[str, ...] = get_args(Variant)
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}
# What `gmlp export` and the start-up export of demo checkpoints write when not told otherwise.
DEFAULT_EXPORT_VARIANTS = ("fp32", "int8")

MASK_TOKEN = "[MASK]"
# Largest `top_k` of a fill-mask request: more candidates than anyone reads, bounded so that one
# request cannot ask for a ranked dump of the whole vocabulary.
MAX_FILL_MASK_TOP_K = 100


# The graph's top-k outputs (docs/formats.md): for every predicted position (masked LM) or image
# (classifier), the ids of the K highest logits, best first (ties: the lower id first), and their
# softmax probabilities over the whole row. config.json records K under GRAPH_TOP_K_KEY; a
# directory without that key has `logits` alone and is served from the full rows.
TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT = "topk_ids", "topk_scores"
GRAPH_TOP_K_KEY = "graph_top_k"
DEFAULT_GRAPH_TOP_K = 32


def package_version() -> str:
    """The installed gmlp-serve version (pyproject.toml is the one place it is written)."""
    try:
        return metadata.version("gmlp-serve")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
