"""The model card summary, read from the committed demo checkpoints' cards (written by `gmlp
model-card`) and checked against the figures of their training.json, where the cards come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.tasks.card import accuracy_leaves, card_summary
from support.helpers import REPO_ROOT

CHECKPOINTS = REPO_ROOT / "checkpoints"


@pytest.mark.parametrize("name", ["cifar10-gmlp", "gutenberg-gmlp-mlm"])
@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_the_served_variants_figures(name: str, variant: str) -> None:
    training = json.loads((CHECKPOINTS / name / "training.json").read_text())
    summary = card_summary(CHECKPOINTS / name, variant)
    assert summary is not None and summary["title"] == name and summary["measured"] == variant
    assert summary["accuracy"] == accuracy_leaves(training["served"][variant]["results"])
    assert summary["accuracy"] and all(0 < v <= 1 for v in summary["accuracy"].values())
    assert summary["description"].startswith("gMLP")


def test_a_variant_the_card_did_not_measure_gets_the_training_figures() -> None:
    training = json.loads((CHECKPOINTS / "cifar10-gmlp" / "training.json").read_text())
    summary = card_summary(CHECKPOINTS / "cifar10-gmlp", "fp16")
    assert summary is not None and summary["measured"] == "training"
    assert summary["accuracy"] == {"cifar10_test top1": training["results"]["cifar10_test"]["top1"]}


def test_no_card_no_summary(tmp_path: Path) -> None:
    assert card_summary(tmp_path, "fp32") is None


def test_a_card_without_figures(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# my-model\n\nA model.\n\n## Results\n```json\nnot json\n```\n")
    assert card_summary(tmp_path, "fp32") == {
        "title": "my-model",
        "description": "A model.",
        "accuracy": {},
        "measured": None,
    }


def test_accuracy_leaves_keep_accuracies_only() -> None:
    results = {"a": {"top1": 0.5, "images": 100, "b": {"top5": 0.9, "loss": 1.2}}, "accuracy": 0.7}
    assert accuracy_leaves(results) == {"a top1": 0.5, "a b top5": 0.9, "accuracy": 0.7}
