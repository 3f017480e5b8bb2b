"""Regenerate the bundled inputs in `loadtests/data/` from the full data sets (run in a checkout).

    .venv/bin/python -m loadtests.make_data --cifar NPZ --text VALID_TXT_GZ [--tokenizer JSON]
        [--images 8] [--sentences 200]

The bundle is the load test's default input, so the locustfile runs without the full data sets (a
container, a laptop, an installed wheel). It is small on purpose (a few KB of JPEGs, a few hundred
sentences): enough variety to exercise decoding and tokenisation, too little to be a copy of
either data set. Token counts are computed here with the BERT vocabulary so that the locustfile
needs no `tokenizers` to fit the model window.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtests.workload import (
    BUNDLED_DIR,
    BUNDLED_SENTENCES,
    masked_sentences_from_text,
    read_text,
    token_counter,
)


def write_images(npz_path: Path, out_dir: Path, count: int) -> list[Path]:
    """The first test image of each of the first `count` classes (one per class: varied content)."""
    import numpy as np

    with np.load(npz_path) as data:
        blob, offsets, labels, classes = (
            data["test_jpeg"],
            data["test_offsets"],
            data["test_labels"],
            data["classes"],
        )
    written = []
    for cls in range(min(count, len(classes))):
        i = int(np.flatnonzero(labels == cls)[0])
        path = out_dir / f"cifar10-test-{i:05d}-{classes[cls]}.jpg"
        path.write_bytes(blob[offsets[i] : offsets[i + 1]].tobytes())
        written.append(path)
    return written


def write_sentences(text_path: Path, tokenizer: Path, out_path: Path, count: int, seed: int = 0) -> int:
    counter, how = token_counter(tokenizer)
    if not how.startswith("counted"):
        raise RuntimeError(f"exact token counts need tokenizers and the BERT tokenizer.json ({how})")
    sentences = masked_sentences_from_text(read_text(text_path), counter, count, seed)
    # Shortest first: a reader sees at once which ones fit a small test model's window.
    sentences.sort(key=lambda s: (s.n_tokens, s.text))
    lines = [
        f"# {len(sentences)} sentences of {text_path.name} (Project Gutenberg, public domain), one word",
        "# masked; first column: tokens incl. [CLS]/[SEP] with bert-base-uncased.",
        "# Regenerate: python -m loadtests.make_data",
        *(f"{s.n_tokens}\t{s.text}" for s in sentences),
    ]
    out_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(sentences)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--cifar", type=Path, required=True, help="CIFAR-10 npz (cifar10-jpeg.npz)")
    parser.add_argument(
        "--text", type=Path, required=True, help="held-out text, e.g. the Gutenberg valid-000.txt.gz"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=Path("checkpoints/gutenberg-gmlp-mlm/tokenizer.json"),
        help="BERT uncased tokenizer.json (default: the demo masked LM's, at a checkout's root)",
    )
    args = parser.parse_args(argv)
    BUNDLED_DIR.mkdir(parents=True, exist_ok=True)
    for old in BUNDLED_DIR.glob("*.jpg"):
        old.unlink()
    images = write_images(args.cifar, BUNDLED_DIR, args.images)
    n = write_sentences(args.text, args.tokenizer, BUNDLED_SENTENCES, args.sentences)
    print(f"wrote {len(images)} JPEGs and {n} sentences to {BUNDLED_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
