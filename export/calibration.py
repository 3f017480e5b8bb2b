"""Calibration inputs for static int8 quantisation, prepared exactly as the service prepares requests.

Static quantisation fixes every activation scale at export time from representative inputs, so a
request's result never depends on what else is in its batch (dynamic quantisation computes the
scale over the whole batch). The inputs go through the served-model contract's preprocessing
(`contract.image.ImageTransform`, `contract.text.FillMaskCodec`, the code the service runs), so
the scales are measured on what the model will really see. Where the inputs come from (a source
given to `gmlp export`, or the set stored in the checkpoint): `contract.calibration`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from contract.calibration import image_bytes, sentences
from contract.errors import InvalidInput, UserError
from contract.image import ImageTransform
from contract.text import FillMaskCodec

Feeds = dict[str, np.ndarray]


def image_feeds(source: Path, served_config: dict[str, Any], count: int, seed: int = 0) -> list[Feeds]:
    (spec,) = served_config["inputs"]
    transform = ImageTransform.for_model(served_config, max_pixels=50_000_000)
    images = image_bytes(Path(source), count, seed)
    if not images:
        raise UserError(f"no calibration images found in {source}")
    return [{spec["name"]: transform(data)[None]} for data in images]


def text_feeds(
    source: Path, served_config: dict[str, Any], tokenizer: Path, count: int, seed: int = 0
) -> list[Feeds]:
    rng = random.Random(seed)
    found = sentences(Path(source))
    rng.shuffle(found)
    codec = FillMaskCodec(tokenizer, served_config)
    feeds: list[Feeds] = []
    for sentence in found:
        words = sentence.split()
        words[rng.randrange(len(words))] = codec.mask_token
        try:
            encoded = codec.encode(" ".join(words))
        except InvalidInput:  # too long for n once tokenised
            continue
        # At the full window, as the scales of the published int8 figures were measured: the real
        # tokens' activations are the same at any length, and the pad rows widen the ranges to
        # what a batch padded to its longest text also contains.
        feeds.append(codec.collate([encoded.feeds], fixed=True))
        if len(feeds) == count:
            break
    if not feeds:
        raise UserError(f"no usable calibration sentences in {source}")
    return feeds


__all__ = ["image_feeds", "text_feeds"]
