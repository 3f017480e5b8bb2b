"""Fixtures of the HTTP tests that the playground's tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.helpers import REPO_ROOT

# A real model card (README.md as `gmlp model-card` writes it), lent to the tiny classifier.
DEMO_CARD = REPO_ROOT / "checkpoints" / "cifar10-gmlp" / "README.md"


@pytest.fixture(scope="session")
def carded_repository(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models' repository, the classifier with the demo classifier's model card."""
    copy = tmp_path_factory.mktemp("carded") / "repository"
    shutil.copytree(repository, copy)
    shutil.copyfile(DEMO_CARD, copy / "tiny-vision" / "README.md")
    return copy
