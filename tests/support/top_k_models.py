"""Tiny models with exactly tied logits, for the tests of the graph's top-k outputs and of the
service answering from them (a plain module: several conftests make `from conftest` ambiguous)."""

from __future__ import annotations

from pathlib import Path

from support.helpers import BERT_TOKENIZER


def tied_checkpoint(source: Path, parent: Path, ids: list[int]) -> Path:
    """A copy of the tiny masked-LM checkpoint `source` in which the vocabulary entries `ids` have
    one embedding row and one decoder bias (so exactly equal logits for every input), raised
    above every other entry: each row's best candidates are exact ties, which only index order
    ranks."""
    import torch

    from model import load_checkpoint, save_checkpoint

    path = parent / "tied-checkpoint"
    if path.is_dir():
        return path
    model = load_checkpoint(source)
    with torch.no_grad():
        model.embed.weight[ids] = model.embed.weight[ids[0]].clone()
        model.decoder_bias[ids] = model.decoder_bias[ids[0]].clone() + 10.0
    save_checkpoint(model, path, tokenizer=BERT_TOKENIZER)
    return path
