"""Calibration inputs for static int8 quantisation, prepared exactly as the service prepares requests.

Static quantisation fixes every activation scale at export time from representative inputs, so a
request's result never depends on what else is in its batch (dynamic quantisation computes the
scale over the whole batch). The inputs go through the service's own preprocessing
(`service.preprocess.ImageTransform`, `service.text.FillMaskCodec`), so the scales are measured on
what the model will really see.

Sources: for a classifier, a directory of images or a CIFAR-style `.npz` (`<split>_jpeg` +
`<split>_offsets`); for a masked LM, a `.txt` or `.txt.gz` file of prose, cut into short sentences
with one word masked (what /fill-mask receives).

A checkpoint directory may carry its own small calibration set (`calibration.npz` of JPEGs or
`calibration.txt.gz` of sentences, written by `write_calibration_set` after training); `gmlp export`
uses it when no other source is given, so the Docker build, which sees only the repository, still
produces static int8.
"""

from __future__ import annotations

import gzip
import random
import re
from pathlib import Path
from typing import Any

import numpy as np

Feeds = dict[str, np.ndarray]
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif"}


def _image_bytes(source: Path, count: int, seed: int) -> list[bytes]:
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
        random.Random(seed).shuffle(files)
        return [p.read_bytes() for p in files[:count]]
    if source.suffix == ".npz":
        data = np.load(source)
        split = next((s for s in ("calib", "train", "test") if f"{s}_jpeg" in data.files), None)
        if split is None:
            raise ValueError(f"{source} has no <split>_jpeg / <split>_offsets arrays")
        blob, offsets = data[f"{split}_jpeg"], data[f"{split}_offsets"]
        picks = random.Random(seed).sample(range(len(offsets) - 1), min(count, len(offsets) - 1))
        return [blob[offsets[i] : offsets[i + 1]].tobytes() for i in picks]
    raise ValueError(f"{source}: expected a directory of images or a .npz of JPEGs")


def image_feeds(source: Path, served_config: dict[str, Any], count: int, seed: int = 0) -> list[Feeds]:
    from service.preprocess import ImageTransform

    (spec,) = served_config["inputs"]
    transform = ImageTransform.from_config(
        served_config["preprocessing"], max_pixels=50_000_000, input_hw=tuple(spec["shape"][-2:])
    )
    images = _image_bytes(Path(source), count, seed)
    if not images:
        raise ValueError(f"no calibration images found in {source}")
    return [{spec["name"]: transform(data)[None]} for data in images]


def _sentences(source: Path) -> list[str]:
    """Sentences of 5-40 words (the size of a typical /fill-mask request) from the start of a text file."""
    opener = gzip.open if str(source).endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8") as f:
        text = f.read(4_000_000)
    pieces = re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text))
    return [s for s in pieces if 5 <= len(s.split()) <= 40]


def text_feeds(
    source: Path, served_config: dict[str, Any], tokenizer: Path, count: int, seed: int = 0
) -> list[Feeds]:
    from service.errors import ServiceError
    from service.text import FillMaskCodec

    rng = random.Random(seed)
    sentences = _sentences(Path(source))
    rng.shuffle(sentences)
    codec = FillMaskCodec(tokenizer, served_config)
    feeds: list[Feeds] = []
    for sentence in sentences:
        words = sentence.split()
        words[rng.randrange(len(words))] = codec.mask_token
        try:
            encoded = codec.encode(" ".join(words))
        except ServiceError:  # too long for n once tokenised
            continue
        feeds.append({k: v[None] for k, v in encoded.feeds.items()})
        if len(feeds) == count:
            break
    if not feeds:
        raise ValueError(f"no usable calibration sentences in {source}")
    return feeds


CALIBRATION_FILES = ("calibration.npz", "calibration.txt.gz")


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
    if task == "fill-mask":
        sentences = _sentences(Path(source))
        picked = rng.sample(sentences, min(count * 2, len(sentences)))  # some get dropped as too long
        out = checkpoint_dir / "calibration.txt.gz"
        with gzip.open(out, "wt", encoding="utf-8") as f:
            f.write("\n".join(picked) + "\n")
        return out
    images = _image_bytes(Path(source), count, seed)
    offsets = np.cumsum([0] + [len(b) for b in images]).astype(np.int64)
    blob = np.frombuffer(b"".join(images), dtype=np.uint8)
    out = checkpoint_dir / "calibration.npz"
    np.savez_compressed(out, calib_jpeg=blob, calib_offsets=offsets)
    return out
