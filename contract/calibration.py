"""Calibration sets for static int8 quantisation: where they come from, and the feeds made of them
(docs/export.md, "Variants", says why static).

Training stores a small set of *training* inputs in the checkpoint (`calibration.npz` of JPEGs or
`calibration.txt.gz` of sentences, docs/formats.md), so that `gmlp export`, and the Docker build
that sees only the repository, still produce static int8. The feeds go through the service's own
preprocessing (`ImageTransform`, `FillMaskCodec`), so the scales are measured on what the model
will really see.
"""

from __future__ import annotations

import gzip
import random
import re
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import InvalidInput, UserError
from contract.formats import MLM_TASK
from contract.image import ImageTransform
from contract.text import FillMaskCodec

Feeds = dict[str, np.ndarray]

CALIBRATION_FILES = ("calibration.npz", "calibration.txt.gz")
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif"}


def image_bytes(source: Path, count: int, seed: int) -> list[bytes]:
    """Up to `count` encoded images from a directory or a CIFAR-style .npz, picked with `seed`."""
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
        random.Random(seed).shuffle(files)
        return [p.read_bytes() for p in files[:count]]
    if source.suffix == ".npz":
        data = np.load(source)
        split = next((s for s in ("calib", "train", "test") if f"{s}_jpeg" in data.files), None)
        if split is None:
            raise UserError(f"{source} has no <split>_jpeg / <split>_offsets arrays")
        blob, offsets = data[f"{split}_jpeg"], data[f"{split}_offsets"]
        picks = random.Random(seed).sample(range(len(offsets) - 1), min(count, len(offsets) - 1))
        return [blob[offsets[i] : offsets[i + 1]].tobytes() for i in picks]
    raise UserError(f"{source}: expected a directory of images or a .npz of JPEGs")


def sentences(source: Path) -> list[str]:
    """Sentences of 5-40 words (the size of a typical /fill-mask request) from the start of a text file."""
    opener = gzip.open if str(source).endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8") as f:
        text = f.read(4_000_000)
    pieces = re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text))
    return [s for s in pieces if 5 <= len(s.split()) <= 40]


def bundled_calibration(checkpoint_dir: Path) -> Path | None:
    """The calibration set stored in a checkpoint directory, if any."""
    return next((checkpoint_dir / f for f in CALIBRATION_FILES if (checkpoint_dir / f).is_file()), None)


def write_calibration_set(
    checkpoint_dir: Path, task: str, source: Path, count: int = 256, seed: int = 0
) -> Path:
    """Store `count` training inputs in the checkpoint (a few hundred KB) for later int8 exports.

    Use training data, never the evaluation split, so the reported test figures stay unseen.
    """
    rng = random.Random(seed)
    if task == MLM_TASK:
        found = sentences(Path(source))
        picked = rng.sample(found, min(count * 2, len(found)))  # some get dropped as too long
        out = checkpoint_dir / "calibration.txt.gz"
        with gzip.open(out, "wt", encoding="utf-8") as f:
            f.write("\n".join(picked) + "\n")
        return out
    images = image_bytes(Path(source), count, seed)
    offsets = np.cumsum([0] + [len(b) for b in images]).astype(np.int64)
    blob = np.frombuffer(b"".join(images), dtype=np.uint8)
    out = checkpoint_dir / "calibration.npz"
    np.savez_compressed(out, calib_jpeg=blob, calib_offsets=offsets)
    return out


def calibration_feeds(
    given: str | Path | None, served: dict[str, Any], checkpoint_dir: Path, count: int
) -> tuple[Path | None, list[Feeds] | None]:
    """(source, feeds prepared as requests are) for static int8, from `given` or else the set
    stored in the checkpoint; (None, None) when there is neither, which makes the int8 variant
    dynamic."""
    source = Path(given) if given else bundled_calibration(checkpoint_dir)
    if source is None:
        return None, None
    if served["task"] != MLM_TASK:
        return source, image_feeds(source, served, count)
    rng = random.Random(0)
    found = sentences(source)
    rng.shuffle(found)
    codec = FillMaskCodec(checkpoint_dir / served["tokenizer"], served["model"])
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
    return source, feeds


def image_feeds(source: Path, served_config: dict[str, Any], count: int) -> list[Feeds]:
    (spec,) = served_config["inputs"]
    transform = ImageTransform.for_model(served_config, max_pixels=50_000_000)
    images = image_bytes(Path(source), count, seed=0)
    if not images:
        raise UserError(f"no calibration images found in {source}")
    return [{spec["name"]: transform(data)[None]} for data in images]
