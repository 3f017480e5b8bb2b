"""How much arithmetic one row of a gMLP costs, from the shapes its config declares.

The serving side decides from this, not from a timing taken at start-up, whether a row running
alone gets every core (`service.settings.ServiceSettings.lone_threads_for`): a timing depends on
what else the machine was doing at that moment, the shapes do not. The benchmarks use the same
counts for the FLOP/s they report. Norms, gates, softmax and biases are not multiply-accumulates
(MACs) and are left out; the counts are those of the matrix products.

A config comes from a served-model directory, that is from whoever can write to the repository,
so every shape is read strictly (a positive int, not a bool or a float) and a config without
them gives None rather than an error: the caller then keeps its cautious default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _positive(model: Mapping[str, Any], key: str) -> int | None:
    value = model.get(key)
    return value if type(value) is int and value > 0 else None


def tokens(model: Mapping[str, Any]) -> int | None:
    """The tokens a row mixes: the patches of an image model, the window of a text model."""
    img, patch = _positive(model, "img_size"), _positive(model, "patch_size")
    if img is not None and patch is not None:
        return (img // patch) ** 2 or None
    return _positive(model, "n")


def block_macs(model: Mapping[str, Any]) -> int | None:
    """MACs of one gMLP block on one row at the full window: the channel projections U (d -> d_ffn)
    and V (d_ffn/2 -> d), the Spatial Gating Unit's n x n projection of d_ffn/2 channels (the same
    count with several heads, each over its share of the channels), and aMLP's tiny attention where
    the config has one (qkv d -> 3a, scores and their weighted sum n x n x a each, a -> d_ffn/2).
    None where the config does not declare the shapes."""
    n, d, ffn = tokens(model), _positive(model, "d_model"), _positive(model, "d_ffn")
    if n is None or d is None or ffn is None:
        return None
    half = ffn // 2
    macs = n * d * ffn + n * n * half + n * half * d
    if (attn := _positive(model, "attn_dim")) is not None:
        macs += n * d * 3 * attn + 2 * n * n * attn + n * attn * half
    return macs


def vision_macs(model: Mapping[str, Any]) -> int | None:
    """MACs of one image through a gMLP classifier: the patch projection, every block and the head."""
    n, depth, block = tokens(model), _positive(model, "depth"), block_macs(model)
    patch, chans = _positive(model, "patch_size"), _positive(model, "in_chans")
    d, classes = _positive(model, "d_model"), _positive(model, "num_classes")
    if None in (n, depth, block, patch, chans, d, classes):
        return None
    assert n and depth and block and patch and chans and d and classes  # for the type checker
    return n * patch * patch * chans * d + depth * block + d * classes
