"""Fill-mask answers from the graph's top-k outputs against the full logits rows, per batch of 16.

    .venv/bin/python -m benchmarks.top_k_graph --served models/gutenberg-gmlp-mlm [--threads 2]

Takes batches of 16 held-out sentences (loadtests/data/sentences.tsv, one [MASK] each, top_k 5),
collated as the service collates them, on the static int8 file (what the service runs on CPU),
and times in turn, medians over `--repeats` interleaved rounds:

- the session run asking for every output against the run asking for `topk_ids` / `topk_scores`
  alone (whether leaving `logits` out of a run saves its copy out of ONNX Runtime);
- the batch's answers from the logits rows (`FillMaskCodec.decode_batch`: normalisers and
  selection over the whole vocabulary) against the answers from the top-k outputs
  (`FillMaskCodec.decode_top`), the work the batch thread does per batch either way.

Then it checks that both paths answer alike: the tokens of every answer equal, and the largest
score difference. The CPU's model name and flags are printed with the table.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import add_timing_arguments, command_line, cpu_line, interleaved_ms
from contract.formats import GRAPH_TOP_K_KEY, TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT, VARIANT_FILES
from contract.text import EncodedText, FillMaskCodec
from export.verify import session
from loadtests.workload import BUNDLED_SENTENCES, read_sentences_tsv

BATCH = 16
TOP_K = 5
TOP_K_PAIR = [TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT]


def batch_of(codec: FillMaskCodec) -> list[EncodedText]:
    """The first BATCH held-out sentences with one [MASK] that fit the model's window."""
    encoded = []
    for sentence in read_sentences_tsv(BUNDLED_SENTENCES):
        if sentence.n_tokens <= codec.n and sentence.text.count("[MASK]") == 1:
            encoded.append(codec.encode(sentence.text))
        if len(encoded) == BATCH:
            return encoded
    sys.exit(f"{BUNDLED_SENTENCES} has fewer than {BATCH} one-mask sentences within {codec.n} tokens")


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--served", type=Path, required=True, help="served-model directory of a masked LM")
    add_timing_arguments(parser, repeats=30)
    args = parser.parse_args()
    config = json.loads((args.served / "config.json").read_text())
    if not config.get(GRAPH_TOP_K_KEY) or config.get("int8_quantization") != "static":
        sys.exit(f"{args.served} needs top-k outputs and a static int8 file: re-export it with gmlp export")
    codec = FillMaskCodec(args.served / config["tokenizer"], config["model"])
    encoded = batch_of(codec)
    feeds = codec.collate([e.feeds for e in encoded])
    sess = session(args.served / VARIANT_FILES["int8"], threads=args.threads)
    names = [o.name for o in sess.get_outputs()]
    outputs = dict(zip(names, sess.run(names, feeds), strict=True))
    rows = range(BATCH)

    def from_logits() -> list[Any]:
        logits = outputs["logits"]
        return codec.decode_batch(encoded, [logits[i] for i in rows], [TOP_K] * BATCH, [None] * BATCH)

    def from_top_k() -> list[Any]:
        ids, scores = outputs[TOP_K_IDS_OUTPUT], outputs[TOP_K_SCORES_OUTPUT]
        return [codec.decode_top(e, ids[i], scores[i], TOP_K) for i, e in zip(rows, encoded, strict=True)]

    ms = interleaved_ms(
        {
            "session.run, every output": functools.partial(sess.run, names, feeds),
            "session.run, top-k pair alone": functools.partial(sess.run, TOP_K_PAIR, feeds),
            "answers from the logits rows": from_logits,
            "answers from the top-k outputs": from_top_k,
        },
        args.repeats,
    )
    print(cpu_line())
    print(
        f"{config['name']} int8 (static), K = {config[GRAPH_TOP_K_KEY]}, batch {BATCH} at "
        f"L = {feeds['input_ids'].shape[1]}, top_k {TOP_K}, {args.threads} threads, "
        f"median of {args.repeats} rounds\n"
    )
    print("| step (one batch) | ms |\n|---|---:|")
    for name, t in ms.items():
        print(f"| {name} | {t:.3f} |")
    full, top = from_logits(), from_top_k()
    pairs = [
        (p, q)
        for a, b in zip(full, top, strict=True)
        for s, t in zip(a, b, strict=True)
        for p, q in zip(s, t, strict=True)
    ]
    same = all(p["token"] == q["token"] for p, q in pairs) and len(pairs) == BATCH * TOP_K
    diff = max(abs(p["score"] - q["score"]) for p, q in pairs)
    print(f"\nthe same tokens in every answer: {same}; largest score difference {diff:.2e}")


if __name__ == "__main__":
    main()
