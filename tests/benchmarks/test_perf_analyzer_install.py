"""The perf_analyzer installer is idempotent: a recorded command that still runs is used as it is,
with nothing downloaded; one that no longer runs (or is not perf_analyzer) is not trusted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import perf_analyzer_install as install


def _script(path: Path, says: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{says}'\n")
    path.chmod(0o755)
    return path


def test_a_recorded_command_that_runs_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _script(tmp_path / "pa", "Perf Analyzer Version 2.60.0 (commit x)")
    (tmp_path / "command.json").write_text(json.dumps([str(tool)]))

    def no_download(cache: Path) -> Path:
        raise AssertionError("downloaded although a working command was recorded")

    monkeypatch.setattr(install, "_binary", no_download)
    assert install.perf_analyzer_command(tmp_path) == [str(tool)]


def test_the_placeholder_and_missing_programs_do_not_count(tmp_path: Path) -> None:
    placeholder = _script(tmp_path / "placeholder", "usage: something else")
    assert not install._runs([str(placeholder)])
    assert not install._runs([str(tmp_path / "absent")])
    assert install._runs([str(_script(tmp_path / "real", "Perf Analyzer Version 2.60.0"))])
