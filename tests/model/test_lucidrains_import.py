"""`gmlp convert-lucidrains`: what it refuses, and why (parity with the package itself is in
tests/lucidrains, which installs it)."""

from __future__ import annotations

import json

import pytest
import torch

from gmlp.cli import main as gmlp
from model.lucidrains_import import circulant_weight
from support.helpers import BERT_TOKENIZER

VOCAB, DIM, N = 30522, 8, 4
LANGUAGE = {"num_tokens": VOCAB, "dim": DIM, "depth": 1, "seq_len": N, "ff_mult": 2}


VISION = {"image_size": 8, "patch_size": 4, "num_classes": 3, "dim": DIM, "depth": 1, "ff_mult": 2}  # n = 4


def package_state(vision: bool = False) -> dict[str, torch.Tensor]:
    """A depth-1 g-mlp-pytorch gMLP's (or gMLPVision's) state_dict, keys and shapes as the package
    names them (the language model's token shift wraps each block, hence `fn.fn.fn`)."""
    block = "layers.0.fn.fn." if vision else "layers.0.fn.fn.fn."
    shapes = {
        "layers.0.fn.norm.weight": (DIM,),
        "layers.0.fn.norm.bias": (DIM,),
        block + "proj_in.0.weight": (2 * DIM, DIM),
        block + "proj_in.0.bias": (2 * DIM,),
        block + "sgu.norm.weight": (DIM,),
        block + "sgu.norm.bias": (DIM,),
        block + "sgu.weight": (1, N, N),
        block + "sgu.bias": (1, N),
        block + "proj_out.weight": (DIM, DIM),
        block + "proj_out.bias": (DIM,),
        "to_logits.0.weight": (DIM,),
        "to_logits.0.bias": (DIM,),
    }
    if vision:
        shapes |= {"to_patch_embed.1.weight": (DIM, 3 * 4 * 4), "to_patch_embed.1.bias": (DIM,)}
        shapes |= {"to_logits.2.weight": (3, DIM), "to_logits.2.bias": (3,)}
    else:
        shapes |= {
            "to_embed.weight": (VOCAB, DIM),
            "to_logits.1.weight": (VOCAB, DIM),
            "to_logits.1.bias": (VOCAB,),
        }
    return {key: torch.randn(shape) for key, shape in shapes.items()}


def convert(tmp_path, args, state=None, *extra: str) -> int:
    torch.save(package_state() if state is None else state, tmp_path / "state.pt")
    (tmp_path / "args.json").write_text(json.dumps(args))
    command = ["convert-lucidrains", str(tmp_path / "state.pt"), "--config", str(tmp_path / "args.json")]
    return gmlp([*command, "--out", str(tmp_path / "out"), *extra])


def test_a_language_model_and_a_classifier_convert(tmp_path):
    assert convert(tmp_path, LANGUAGE, None, "--tokenizer", str(BERT_TOKENIZER)) == 0
    info = json.loads((tmp_path / "out" / "config.json").read_text())
    assert info["task"] == "fill-mask" and info["model"]["tie_embeddings"] is False
    (tmp_path / "vision").mkdir()
    assert convert(tmp_path / "vision", VISION, package_state(vision=True)) == 0
    info = json.loads((tmp_path / "vision" / "out" / "config.json").read_text())
    assert info["task"] == "image-classification" and info["seq_len"] == N


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({**LANGUAGE, "causal": True}, ["causal=true", "neither /classify nor /fill-mask"]),
        ({**LANGUAGE, "act": "Softplus"}, ["act='Softplus'", "identity, tanh"]),
        ({**LANGUAGE, "dropout": 0.1, "depth": None}, ["'dropout' is not an argument of gMLP", "depth=None"]),
        ({"num_tokens": VOCAB, "dim": DIM}, ["missing argument 'depth'", "missing argument 'seq_len'"]),
        ({**LANGUAGE, "heads": 3}, ["heads=3 must divide"]),
        ({**LANGUAGE, "num_tokens": None}, ["num_tokens=None: a gMLP without embedding"]),
    ],
)
def test_arguments_it_cannot_honour_are_named(tmp_path, capsys, args, named):
    assert convert(tmp_path, args, None, "--tokenizer", str(BERT_TOKENIZER)) == 1
    err = capsys.readouterr().err
    for text in named:
        assert text in err
    assert not (tmp_path / "out").exists()


def test_vision_arguments_it_cannot_honour_are_named(tmp_path, capsys):
    args = {"image_size": [32, 16], "patch_size": 4, "num_classes": 3, "dim": DIM, "depth": 1, "seq_len": 4}
    assert convert(tmp_path, args, {}) == 1
    err = capsys.readouterr().err
    assert "'seq_len' is not an argument of gMLPVision" in err
    assert "image_size=[32, 16]: only square images" in err


def test_every_missing_unexpected_and_misshaped_key_is_named(tmp_path, capsys):
    state = package_state()
    del state["layers.0.fn.fn.fn.sgu.bias"]
    state["layers.0.fn.fn.fn.sgu.weight"] = torch.randn(1, N + 1, N + 1)
    state["layers.0.fn.fn.fn.extra"] = torch.zeros(1)
    assert convert(tmp_path, LANGUAGE, state, "--tokenizer", str(BERT_TOKENIZER)) == 1
    err = capsys.readouterr().err
    assert "missing key 'layers.0.fn.fn.fn.sgu.bias'" in err
    assert "unexpected key 'layers.0.fn.fn.fn.extra'" in err
    assert "key 'layers.0.fn.fn.fn.sgu.weight' has shape (1, 5, 5), the model expects (1, 4, 4)" in err


def test_options_that_do_not_fit_the_model_kind_are_refused(tmp_path, capsys):
    assert convert(tmp_path, LANGUAGE) == 1
    assert "needs --tokenizer" in capsys.readouterr().err
    assert convert(tmp_path, LANGUAGE, None, "--labels", str(tmp_path / "args.json")) == 1
    assert "--labels does not apply to a gMLP language model" in capsys.readouterr().err
    assert convert(tmp_path, {**LANGUAGE, "num_tokens": 100}, None, "--tokenizer", str(BERT_TOKENIZER)) == 1
    assert "has 30522 tokens, num_tokens is 100" in capsys.readouterr().err


class Payload:
    """Not a tensor: torch.load(weights_only=True) must refuse to build it."""


def test_pickled_objects_are_not_unpickled(tmp_path, capsys):
    assert convert(tmp_path, LANGUAGE, {"weights": Payload()}, "--tokenizer", str(BERT_TOKENIZER)) == 1
    assert "as a weights-only checkpoint" in capsys.readouterr().err


def test_circulant_weight_is_lower_triangular_toeplitz_scaled_by_positions():
    """Row i, column j holds w[n - 1 - (i - j)] for j <= i, zero above; then x[i] * y[j]."""
    h, n = 2, 5
    w, x, y = torch.randn(h, n), torch.randn(h, n), torch.randn(h, n)
    matrix = circulant_weight(w, x, y)
    for head in range(h):
        for i in range(n):
            for j in range(n):
                value = w[head, n - 1 - (i - j)] * x[head, i] * y[head, j] if j <= i else 0.0
                assert float(matrix[head, i, j]) == pytest.approx(float(value), rel=1e-6, abs=0)
