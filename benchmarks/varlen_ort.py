"""Variable-length fill-mask on raw ONNX Runtime: sequences/s at L tokens vs the fixed window of n.

    gmlp export checkpoints/gutenberg-gmlp-mlm --out /tmp/varlen-models/gutenberg-gmlp-mlm \\
        --variants fp32,int8
    .venv/bin/python -m benchmarks.varlen_ort --served /tmp/varlen-models/gutenberg-gmlp-mlm [--threads 2]

Times the static int8 file (what the service runs on CPU) at batch 16: texts of L = 16/32/64/128
tokens with one [MASK] each, run at their own length, against the fixed window every request ran
at before (L = n with all max_predictions slots decoded). The shapes are timed in turn, medians
over `--repeats` rounds, and each is given as a ratio to the window measured in the same rounds.

Then it checks that the speed costs nothing: each held-out sentence of loadtests/data/sentences.tsv
is run at its own length and padded to n, with the fp32 and the int8 file, and the largest
|logit difference| at its masked positions is printed, with how many top-5 lists differ.
The CPU's model name and flags are printed with the table.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness import add_timing_arguments, command_line, cpu_line, interleaved_ms
from contract.formats import VARIANT_FILES
from contract.text import FillMaskCodec
from export.verify import session
from loadtests.workload import BUNDLED_SENTENCES, read_sentences_tsv

BATCH = 16
LENGTHS = (16, 32, 64, 128)
Feeds = dict[str, np.ndarray]


def texts(model: dict, length: int, predictions: int, rng: np.random.Generator) -> Feeds:
    """A batch of BATCH texts of `length` real tokens, `predictions` positions decoded in each."""
    return {
        "input_ids": rng.integers(1000, model["vocab_size"], (BATCH, length)),
        "mask_positions": rng.integers(0, length, (BATCH, predictions)),
    }


def speed_table(served: Path, model: dict, threads: int, repeats: int) -> list[str]:
    sess = session(served / VARIANT_FILES["int8"], threads=threads)
    rng = np.random.default_rng(0)
    n, slots = model["n"], model["max_predictions"]
    window = f"fixed window (L = {n}, {slots} slots)"
    cases = {window: texts(model, n, slots, rng)}
    cases.update({f"L = {length}, 1 mask": texts(model, length, 1, rng) for length in LENGTHS})
    ms = interleaved_ms(
        {name: functools.partial(sess.run, ["logits"], f) for name, f in cases.items()}, repeats
    )
    lines = [
        "| input shape (batch 16) | ms per batch | sequences/s | x fixed window |",
        "|---|---:|---:|---:|",
    ]
    for name, t in ms.items():
        lines.append(f"| {name} | {t:.2f} | {1000 * BATCH / t:.0f} | {ms[window] / t:.2f}x |")
    return lines


def exactness(served: Path, config: dict, variant: str) -> str:
    """Largest |logit diff| at the masked positions, own length vs padded to n, held-out sentences."""
    sess = session(served / VARIANT_FILES[variant])
    codec = FillMaskCodec(served / config["tokenizer"], config["model"])
    sentences = read_sentences_tsv(BUNDLED_SENTENCES)
    worst, top5_differ, lengths = 0.0, 0, []
    for sentence in sentences:
        encoded = codec.encode(sentence.text)
        count = len(encoded.mask_positions)
        padded = sess.run(["logits"], codec.collate([encoded.feeds], fixed=True))[0][0, :count]
        short = sess.run(["logits"], {k: v[None] for k, v in encoded.feeds.items()})[0][0]
        worst = max(worst, float(np.abs(short - padded).max()))
        top5 = [np.argsort(-x, axis=-1)[:, :5] for x in (short, padded)]
        top5_differ += int(not np.array_equal(top5[0], top5[1]))
        lengths.append(len(encoded.ids))
    return (
        f"| {variant} | {len(sentences)} | {min(lengths)}-{max(lengths)} (median "
        f"{int(np.median(lengths))}) | {worst:.2e} | {top5_differ} |"
    )


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--served", type=Path, required=True, help="served-model directory of a masked LM")
    add_timing_arguments(parser, repeats=15)
    args = parser.parse_args()
    config = json.loads((args.served / "config.json").read_text())
    if config.get("int8_quantization") != "static":
        sys.exit(f"{args.served} has no static int8 file; export it with --variants fp32,int8")
    print(cpu_line())
    print(f"{config['name']} int8 (static), {args.threads} threads, median of {args.repeats} rounds\n")
    print("\n".join(speed_table(args.served, config["model"], args.threads, args.repeats)))
    print("\nOwn length vs padded to n, same file:\n")
    print("| file | sentences | tokens | max abs logit diff | top-5 lists that differ |")
    print("|---|---:|---|---:|---:|")
    for variant in ("fp32", "int8"):
        print(exactness(args.served, config, variant))


if __name__ == "__main__":
    main()
