"""`gmlp serve`'s start-up export: it runs only with gmlp-serve's own `export` package and torch."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import export  # noqa: F401 - ours, imported first so that the tests below can put it back
from contract.spec import SpecError
from gmlp.serve_command import export_missing


@pytest.fixture
def checkpoints(tmp_path: Path, tiny_vision_checkpoint: Path) -> Path:
    """A checkpoint folder holding one checkpoint that has no served directory yet."""
    folder = tmp_path / "checkpoints"
    shutil.copytree(tiny_vision_checkpoint, folder / "demo-vision")
    return folder


def test_a_foreign_export_module_is_not_taken_for_ours(
    tmp_path: Path, checkpoints: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another project's module named `export`, first on sys.path, is named in the refusal."""
    elsewhere = tmp_path / "other-project"
    elsewhere.mkdir()
    (elsewhere / "export.py").write_text('"""Another project\'s export utilities."""\n\nFORMATS = ["csv"]\n')
    monkeypatch.delitem(sys.modules, "export")
    monkeypatch.syspath_prepend(str(elsewhere))
    with pytest.raises(SpecError) as refused:
        export_missing(checkpoints, tmp_path / "models")
    message = str(refused.value)
    assert f"the module named 'export' found first ({elsewhere / 'export.py'})" in message
    assert "is not gmlp-serve's export package" in message
    assert "gmlp export" in message and "demo-vision" in message  # still says what to run
    assert not (tmp_path / "models").exists()


def test_without_torch_the_export_command_is_given(
    tmp_path: Path, checkpoints: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec sees where torch is not installed
    with pytest.raises(SpecError, match=r"\(torch is not installed\): run gmlp export .*demo-vision"):
        export_missing(checkpoints, tmp_path / "models")
    assert not (tmp_path / "models").exists()
