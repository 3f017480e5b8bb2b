"""Helpers shared by the tests (a plain module, so no conftest.py name clash across folders)."""

from __future__ import annotations

from pathlib import Path

from gmlp.paths import SHARED_DATA_ENV, shared_data

# The checkout the tests run from (tests may find the repository's files by their own location;
# the product never does).
REPO_ROOT = Path(__file__).resolve().parents[2]
# Small inputs committed with the tests (tests/data/README.md says what each is and how it was cut).
TEST_DATA = REPO_ROOT / "tests" / "data"
CIFAR_SAMPLE_NPZ = TEST_DATA / "cifar10-test-300.npz"
TEXT_SAMPLE = TEST_DATA / "gutenberg-sample.txt"
# The BERT uncased tokenizer, as the demo masked LM ships it.
BERT_TOKENIZER = REPO_ROOT / "checkpoints" / "gutenberg-gmlp-mlm" / "tokenizer.json"


def shared_data_dir() -> Path | None:
    """The full data sets (CIFAR-10, Gutenberg, BERT vocabulary) if this machine has them.

    `$GMLP_SHARED_DATA` (an error when it names no folder: a typo must not turn into skipped
    tests), else a `shared/data` folder beside the checkout, else None. Tests that need them carry
    the `shared_data` marker and are skipped without them.
    """
    root = shared_data()
    if root is not None:
        if not root.is_dir():
            raise FileNotFoundError(f"{SHARED_DATA_ENV}={root} is not a directory")
        return root
    beside = REPO_ROOT.parent / "shared" / "data"
    return beside if beside.is_dir() else None


CIFAR_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def perturbed(model):
    """A model whose weights are moved away from the init (zero head, W ~ 0), so outputs differ per input."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


def tiny_vision_config(**overrides):
    from model import get_config

    return get_config("gmlp_cifar_p4", **{"depth": 2, "d_model": 32, "d_ffn": 64, **overrides})


def tiny_mlm_config(**overrides):
    from model import get_config

    return get_config("gmlp_mlm_small", **{"depth": 2, "d_model": 32, "d_ffn": 64, "n": 32, **overrides})


# Scores of one answer computed two ways (a graph's float32 top-k outputs, the service's float64
# softmax of the logits) agree within this relative tolerance.
SCORE_RTOL = 1e-5


def assert_same_answers(got, expected) -> None:
    """Answers (nested lists of prediction dicts, as the task routes return them) are the same:
    every field equal except the scores, which agree within `SCORE_RTOL`."""
    import pytest

    def strip(answer):
        if isinstance(answer, dict):
            return {k: v for k, v in answer.items() if k != "score"}
        return [strip(a) for a in answer]

    def scores(answer):
        if isinstance(answer, dict):
            return [answer["score"]]
        return [s for a in answer for s in scores(a)]

    assert strip(got) == strip(expected)
    assert scores(got) == pytest.approx(scores(expected), rel=SCORE_RTOL, abs=1e-9)
