"""The model card summary, read from the committed demo checkpoints' cards (written by `gmlp
model-card`) and checked against the figures of their training.json, where the cards come from;
and a card that is not a regular file or is over its bound, refused at once with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contract.limits import MAX_CARD_BYTES
from contract.spec import SpecError
from service.tasks.card import accuracy_leaves, card_summary
from support.broken_dirs import outcome_within, release_readers
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


def test_a_card_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "README.md")  # nobody ever writes: a read of it would never return
    try:
        refused = outcome_within(lambda: card_summary(tmp_path, "fp32"), 30)
    finally:
        release_readers([tmp_path / "README.md"])
    assert isinstance(refused, SpecError) and "README.md: a FIFO, not a regular file" in str(refused)


def test_a_card_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    with (tmp_path / "README.md").open("wb") as handle:
        handle.truncate(400 << 20)  # sparse: read whole, it would cost 400 MiB and more
    with pytest.raises(SpecError, match=f"419,430,400 bytes, larger than its bound of {MAX_CARD_BYTES:,}"):
        card_summary(tmp_path, "fp32")


def test_a_card_not_utf8_or_linked_out_is_not_shown(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_bytes(b"# \xff\xfe\n")
    assert card_summary(tmp_path, "fp32") is None
    (tmp_path / "README.md").unlink()
    (tmp_path.parent / "elsewhere.md").write_text("# elsewhere\n")
    (tmp_path / "README.md").symlink_to(tmp_path.parent / "elsewhere.md")
    assert card_summary(tmp_path, "fp32") is None


def test_accuracy_leaves_keep_accuracies_only() -> None:
    results = {"a": {"top1": 0.5, "images": 100, "b": {"top5": 0.9, "loss": 1.2}}, "accuracy": 0.7}
    assert accuracy_leaves(results) == {"a top1": 0.5, "a b top5": 0.9, "accuracy": 0.7}
