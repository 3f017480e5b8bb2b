"""Data for the demo models: CIFAR-10 from JPEGs, Gutenberg token ids, augmentation, BERT masking.

Decoding 60,000 JPEGs or tokenising 9M words takes longer than many training steps, so both are
done once and cached as .npy under a gitignored cache directory (keyed by source file, size and
limit). Batches are drawn with a generator seeded by (seed, step), which makes a resumed run draw
exactly the batches it would have drawn without the interruption.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from contract.errors import UserError

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def _cache_key(*parts: object) -> str:
    """A short hash of `parts`, a file standing for its path, size and modification time."""
    ids = [
        f"{p.resolve()}:{p.stat().st_size}:{int(p.stat().st_mtime)}" if isinstance(p, Path) else p
        for p in parts
    ]
    return hashlib.sha1("|".join(map(str, ids)).encode()).hexdigest()[:12]


def load_cifar(
    npz_path: str | Path, split: str, limit: int | None = None, cache_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 [N, 32, 32, 3], labels int64 [N], class names) for `split` ('train' or 'test')."""
    npz_path = Path(npz_path)
    data = np.load(npz_path)
    classes = [str(c) for c in data["classes"]]
    labels = data[f"{split}_labels"].astype(np.int64)
    count = len(labels) if limit is None else min(limit, len(labels))
    # The file is sorted by class, so a limit takes a fixed random subset, not the first images.
    index = (
        np.arange(len(labels))
        if count == len(labels)
        else np.sort(np.random.default_rng(0).permutation(len(labels))[:count])
    )
    labels = labels[index]
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"cifar10-{split}-{count}-{_cache_key(npz_path)}.npy"
        if cache.is_file():
            return np.load(cache), labels, classes
    blob, offsets = data[f"{split}_jpeg"], data[f"{split}_offsets"]
    images = np.empty((count, 32, 32, 3), dtype=np.uint8)
    for out_i, i in enumerate(index):
        raw = blob[offsets[i] : offsets[i + 1]].tobytes()
        images[out_i] = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, images)
        tmp.replace(cache)
    return images, labels, classes


def augment_crop_flip(images: np.ndarray, rng: np.random.Generator, pad: int = 4) -> np.ndarray:
    """Random crop from a zero-padded image and random horizontal flip (the usual CIFAR recipe)."""
    batch, height, width, _ = images.shape
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    dy = rng.integers(0, 2 * pad + 1, size=(batch,))
    dx = rng.integers(0, 2 * pad + 1, size=(batch,))
    flip = rng.random((batch,)) < 0.5
    out = np.empty_like(images)
    for i in range(batch):
        crop = padded[i, dy[i] : dy[i] + height, dx[i] : dx[i] + width]
        out[i] = crop[:, ::-1] if flip[i] else crop
    return out


def random_erase(
    images: np.ndarray, rng: np.random.Generator, prob: float, scale: tuple[float, float] = (0.02, 0.25)
) -> np.ndarray:
    """Random erasing (Zhong et al. 2017): with probability `prob` per image, overwrite one random
    rectangle of 2-25% of the area (aspect 1/3-3) with the dataset mean, which is zero after
    normalisation. gMLPs overfit CIFAR-10 quickly (no convolutional prior), and this regularises
    at no measurable cost per step."""
    batch, height, width, _ = images.shape
    out = images.copy()
    mean = np.rint(np.asarray(CIFAR_MEAN) * 255).astype(np.uint8)
    for i in np.flatnonzero(rng.random(batch) < prob):
        area = rng.uniform(*scale) * height * width
        aspect = np.exp(rng.uniform(np.log(1 / 3), np.log(3)))
        h = int(min(height, max(1, round(np.sqrt(area * aspect)))))
        w = int(min(width, max(1, round(np.sqrt(area / aspect)))))
        y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        out[i, y : y + h, x : x + w] = mean
    return out


def to_pixel_values(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 NHWC -> normalised float32 NCHW, as the service's preprocessing produces."""
    x: np.ndarray = images.astype(np.float32) * (1.0 / 255.0)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]*[A-Z0-9])")


def split_sentences(paragraph: str) -> list[str]:
    """Rough English sentence split (good enough to draw short samples like those users send)."""
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]


def iter_paragraphs(path: Path) -> Iterator[str]:
    """Blank-line separated paragraphs of a gzip text file, each joined onto one line."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for text, lines in itertools.groupby((line.strip() for line in f), key=bool):
            if text:
                yield " ".join(lines)


@dataclass
class TokenCorpus:
    """Token ids of consecutive sentences (no specials) with per-sentence offsets and word counts."""

    ids: np.ndarray  # uint16 [T] (BERT's vocabulary fits)
    offsets: np.ndarray  # int64 [S + 1]
    words: np.ndarray  # int32 [S]

    @property
    def num_sentences(self) -> int:
        return len(self.words)

    def sentence(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def short_sentences(self, min_words: int = 5, max_words: int = 40, max_tokens: int = 126) -> np.ndarray:
        """Indices of sentences like a fill-mask request: 5-40 words that fit the window."""
        lengths = np.diff(self.offsets)
        keep = (self.words >= min_words) & (self.words <= max_words) & (lengths <= max_tokens) & (lengths > 0)
        return np.flatnonzero(keep)


def load_corpus(
    files: list[Path], tokenizer_path: Path, cache_dir: Path | None = None, max_sentences: int | None = None
) -> TokenCorpus:
    """Tokenise `files` (gzip text) sentence by sentence with the WordPiece tokenizer, cached."""
    files = [Path(f) for f in files]
    cache = None
    if cache_dir is not None:
        key = _cache_key(*files, Path(tokenizer_path), max_sentences)
        cache = Path(cache_dir) / f"corpus-{files[0].stem.split('.')[0]}-{len(files)}f-{key}.npz"
        if cache.is_file():
            with np.load(cache) as z:
                return TokenCorpus(z["ids"], z["offsets"], z["words"])
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()  # the BERT tokenizer.json pads/truncates to 128; we want raw sentences
    tokenizer.no_truncation()
    paragraphs = (paragraph for path in files for paragraph in iter_paragraphs(path))
    sentences = list(itertools.islice((s for p in paragraphs for s in split_sentences(p)), max_sentences))
    chunks, lengths = [], []
    for start in range(0, len(sentences), 20_000):
        for enc in tokenizer.encode_batch(sentences[start : start + 20_000], add_special_tokens=False):
            chunks.append(np.asarray(enc.ids, dtype=np.uint16))
            lengths.append(len(enc.ids))
    ids = np.concatenate(chunks) if chunks else np.zeros(0, np.uint16)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    words = np.asarray([len(s.split()) for s in sentences], dtype=np.int32)
    corpus = TokenCorpus(ids, offsets, words)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, ids=ids, offsets=offsets, words=words)
        tmp.replace(cache)
    return corpus


@dataclass(frozen=True)
class SpecialIds:
    """The ids masking must know; read from the tokenizer so nothing is hard-coded twice."""

    pad: int
    cls: int
    sep: int
    mask: int
    vocab_size: int
    first_regular: int = 999  # BERT: ids below are [PAD], [unused*] and the specials

    @classmethod
    def from_tokenizer(cls, tokenizer_path: str | Path) -> SpecialIds:
        try:
            tok = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # tokenizers raises a bare Exception for any file it cannot use
            raise UserError(f"{tokenizer_path} is not a usable tokenizers JSON file: {exc}") from None
        ids = {name: tok.token_to_id(f"[{name.upper()}]") for name in ("pad", "cls", "sep", "mask")}
        missing = [f"[{name.upper()}]" for name, token_id in ids.items() if token_id is None]
        if missing:
            raise UserError(
                f"{tokenizer_path} has no {', '.join(missing)} token; a BERT-style vocabulary is needed"
            )
        return cls(
            **{name: int(token_id) for name, token_id in ids.items() if token_id is not None},
            vocab_size=tok.get_vocab_size(),
        )


def full_window(corpus: TokenCorpus, sentence: int, n: int, special: SpecialIds) -> np.ndarray:
    """[CLS] + n-2 consecutive tokens starting at a sentence start + [SEP] (wrapping at the end)."""
    start = int(corpus.offsets[sentence])
    body = corpus.ids[start : start + n - 2]
    if len(body) < n - 2:
        body = np.concatenate([body, corpus.ids[: n - 2 - len(body)]])
    return np.concatenate([[special.cls], body, [special.sep]]).astype(np.int64)


def short_window(corpus: TokenCorpus, sentence: int, n: int, special: SpecialIds) -> np.ndarray:
    """[CLS] sentence [SEP] [PAD]... : what the service sends for a short fill-mask request."""
    body = corpus.sentence(sentence)[: n - 2]
    row = np.full(n, special.pad, dtype=np.int64)
    row[0], row[1 : 1 + len(body)], row[1 + len(body)] = special.cls, body, special.sep
    return row


def mask_tokens(
    input_ids: np.ndarray,
    rng: np.random.Generator,
    special: SpecialIds,
    max_predictions: int,
    rate: float = 0.15,
    bert_mix: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT masking (Devlin et al. 2019, section 3.1) of a batch [B, n] of int64 ids.

    Per row, round(rate * real tokens) positions (at least 1, at most `max_predictions`) are chosen
    among tokens that are not [CLS]/[SEP]/[PAD]; with `bert_mix` 80% of them become [MASK], 10% a
    random regular token and 10% stay, otherwise all become [MASK] (what fill-mask users send).
    Returns (corrupted ids [B, n], positions [B, P], labels [B, P] with -100 in unused slots).
    """
    batch, _ = input_ids.shape
    candidate = (input_ids != special.pad) & (input_ids != special.cls) & (input_ids != special.sep)
    counts = np.clip(np.rint(candidate.sum(1) * rate).astype(np.int64), 1, max_predictions)
    counts = np.minimum(counts, candidate.sum(1))
    scores = np.where(candidate, rng.random(input_ids.shape), -1.0)
    order = np.argsort(-scores, axis=1)[:, :max_predictions]
    slot_used = np.arange(max_predictions)[None, :] < counts[:, None]
    positions = np.where(slot_used, order, 0)
    rows = np.arange(batch)[:, None]
    labels = np.where(slot_used, input_ids[rows, positions], -100)
    corrupted = input_ids.copy()
    choice = rng.random(positions.shape)
    to_mask = slot_used & ((choice < 0.8) if bert_mix else True)
    to_random = slot_used & (choice >= 0.8) & (choice < 0.9) if bert_mix else np.zeros_like(slot_used)
    random_ids = rng.integers(special.first_regular, special.vocab_size, size=positions.shape)
    new_ids = np.where(to_mask, special.mask, np.where(to_random, random_ids, input_ids[rows, positions]))
    r, c = np.nonzero(slot_used)  # unused slots point at position 0 and must not write there
    corrupted[r, positions[r, c]] = new_ids[r, c]
    return corrupted, positions.astype(np.int64), labels.astype(np.int64)
