"""The commands that open a graph refuse one whose external data reaches outside its directory
(tests/support/external_graphs.py) in one line `gmlp <command>: error: ...`, exit status 1, no
traceback, nothing written, and the file outside never read: `gmlp inline` and `gmlp info` on a
served directory (the real console script), and `gmlp export` when the graph it checks names such
data (the CLI entry, its exporter made to write one). A JSON file that is a FIFO ends a command at
once instead of blocking it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

import export.directory
from gmlp.cli import main as gmlp
from support.broken_dirs import copy_export, release_readers
from support.external_graphs import HOSTILE, INSIDE_NAME, outside_file, untouched


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gmlp", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _one_line_error(stderr: str, returncode: int, command: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gmlp {command}: error: "), stderr[-3000:]
    assert returncode == 1
    return lines[0]


@pytest.mark.parametrize(
    ("command", "case"), [("inline", "hard-link"), ("inline", "dot-dot"), ("info", "symlink")]
)
def test_inline_and_info_refuse_a_served_graph_with_outside_data(
    tmp_path: Path, tiny_vision_served: Path, command: str, case: str
) -> None:
    served = copy_export(tiny_vision_served, tmp_path / "served")
    outside = outside_file(tmp_path)
    words = HOSTILE[case](served, outside, "model.onnx")
    args = [command, served] + (["--out", tmp_path / "inlined.onnx"] if command == "inline" else [])
    done = _run(*args)
    line = _one_line_error(done.stderr, done.returncode, command)
    assert words in line and "tensor 'w'" in line and str(served / "model.onnx") in line, line
    assert not (tmp_path / "inlined.onnx").exists()
    assert untouched(outside)


def test_export_refuses_a_graph_whose_weights_are_a_hard_link_out(
    tmp_path: Path,
    tiny_vision_checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The exporter made to leave its largest weight in external data through a hard link to a
    file outside holding the very bytes (ONNX Runtime would load it): the export's check refuses."""
    outside = outside_file(tmp_path)
    real_export = export.directory.export_onnx

    def leaking(*args: object, **kwargs: object) -> Path:
        path = Path(real_export(*args, **kwargs))  # type: ignore[arg-type]
        model = onnx.load(str(path))
        weight = max(model.graph.initializer, key=lambda t: len(t.raw_data))
        outside.unlink()
        outside.write_bytes(numpy_helper.to_array(weight).tobytes())
        os.link(outside, path.parent / INSIDE_NAME)
        weight.ClearField("raw_data")
        weight.data_location = onnx.TensorProto.EXTERNAL
        weight.external_data.add(key="location", value=INSIDE_NAME)
        onnx.save(model, str(path))
        status = outside.stat()
        os.utime(outside, ns=(status.st_mtime_ns - 10**12, status.st_mtime_ns))
        return path

    monkeypatch.setattr(export.directory, "export_onnx", leaking)
    status = gmlp(
        ["export", str(tiny_vision_checkpoint), "--out", str(tmp_path / "never"), "--variants", "fp32"]
    )
    line = _one_line_error(capsys.readouterr().err, status, "export")
    assert "hard links to one file" in line and "external data" in line, line
    assert not (tmp_path / "never").exists()
    assert untouched(outside)


def test_a_json_file_that_is_a_fifo_ends_the_command_at_once(tmp_path: Path) -> None:
    """`gmlp convert-lucidrains --config FIFO`: refused on the file's kind; before, the command
    waited on the FIFO for a writer that never comes (the bounded wait is `_run`'s timeout)."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    (tmp_path / "w.safetensors").write_bytes(b"")
    try:
        done = _run(
            "convert-lucidrains", tmp_path / "w.safetensors", "--config", fifo, "--out", tmp_path / "out"
        )
    finally:
        release_readers([fifo])
    line = _one_line_error(done.stderr, done.returncode, "convert-lucidrains")
    assert f"JSON file {fifo}: a FIFO, not a regular file" in line, line
