"""Every file of a model directory is read as a regular file within its bound (`contract.spec`'s
`open_regular` / `read_regular`, the bounds of `contract.limits`): a FIFO, a socket, a device, a
directory or a symlink to one is refused at once with a reason naming its kind, a file over its
bound with its size and the bound, before a byte is read; a FIFO swapped in after the `stat` that
would have refused it is refused by `fstat` on the descriptor, never waited on. Each call that
could block runs in a thread (or, for the tokenizer library, which blocks holding the GIL, a child
process) with a bounded wait, so that a regression fails instead of hanging."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import contract.spec as spec_module
from contract.check import run_check
from contract.limits import MAX_LABELS_BYTES, MAX_TOKENIZER_BYTES
from contract.spec import SpecError, open_regular, read_regular, read_spec
from contract.text import load_tokenizer
from support.broken_dirs import copy_export, outcome_within, read_config, release_readers, write_config

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


def _refused(call: Callable[[], Any], *words: str) -> str:
    exc = outcome_within(call, WAIT_S)
    assert isinstance(exc, SpecError), repr(exc)
    assert all(w in str(exc) for w in words), str(exc)
    return str(exc)


@pytest.fixture
def fifos(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Makes FIFOs, released at the end (`release_readers`) should a regression block on one."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    release_readers(made)


def test_special_files_are_refused_by_kind(tmp_path: Path, fifos: Callable[[Path], Path]) -> None:
    fifo = fifos(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(fifo)
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    try:
        for name, kind in [
            ("fifo", "a FIFO"),
            ("link", "a FIFO"),
            ("sock", "a socket"),
            ("dir", "a directory"),
        ]:
            _refused(
                lambda n=name: read_regular(tmp_path / n, "labels", 100), f"labels {tmp_path / name}", kind
            )
        _refused(lambda: read_regular(Path("/dev/zero"), "card", 100), "a character device")
        _refused(lambda: read_regular(tmp_path / "missing", "card", 100), "cannot be read")
    finally:
        listening.close()


def test_a_fifo_swapped_in_after_the_stat_is_refused_by_fstat(
    tmp_path: Path, fifos: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    regular = tmp_path / "regular.json"
    regular.write_text("[]")
    fifo = fifos(tmp_path / "labels.json")
    real_stat = os.stat
    # The stat before opening sees a regular file (the swap happens right after it).
    monkeypatch.setattr(spec_module.os, "stat", lambda p, *a, **k: real_stat(regular if p == fifo else p))
    _refused(lambda: open_regular(fifo, "labels", 100), "a FIFO, not a regular file")


def test_files_over_their_bound_are_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "labels.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_LABELS_BYTES + 1)  # sparse: the size alone says it is too large
    reason = _refused(lambda: read_regular(big, "labels", MAX_LABELS_BYTES), str(big))
    assert f"{MAX_LABELS_BYTES + 1:,} bytes" in reason and f"bound of {MAX_LABELS_BYTES:,} bytes" in reason
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 100)
    assert read_regular(exact, "card", 100) == b"x" * 100


def _version(tmp_path: Path, served: Path, **config: object) -> Path:
    target = copy_export(served, tmp_path / "version")
    if config:
        changed = read_config(target) | config
        write_config(target, {k: v for k, v in changed.items() if v is not None})
    return target


def test_labels_and_check_read_after_the_scan_refuse_a_fifo(
    tmp_path: Path, tiny_vision_served: Path, fifos: Callable[[Path], Path]
) -> None:
    directory = _version(tmp_path, tiny_vision_served, labels=None)  # the default labels.json
    spec = read_spec(directory)
    assert spec is not None and len(spec.labels()) == read_config(directory)["model"]["num_classes"]
    fifos(directory / "labels.json")
    _refused(spec.labels, "labels", "labels.json", "a FIFO")
    fifos(directory / "check.npz")
    entry = spec.config["check"]
    _refused(lambda: run_check(directory, entry, "fp32", lambda feeds: {}), "check file", "a FIFO")
    fifos(directory / "model.onnx")
    _refused(lambda: spec.variant_path("fp32"), "variant fp32", "a FIFO")


def test_deep_or_foreign_labels_are_a_spec_error(tmp_path: Path, tiny_vision_served: Path) -> None:
    directory = _version(tmp_path, tiny_vision_served)
    spec = read_spec(directory)
    assert spec is not None
    for content in (b"[" * 100_000, b"\xff\xfe", b'{"cat": 0}'):
        (directory / "labels.json").unlink()
        (directory / "labels.json").write_bytes(content)
        _refused(spec.labels, "labels.json")


def test_a_tokenizer_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "tokenizer.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_TOKENIZER_BYTES + 1)
    _refused(lambda: load_tokenizer(big), "tokenizer", str(big), f"bound of {MAX_TOKENIZER_BYTES:,} bytes")
    (tmp_path / "junk.json").write_text('{"not": "a tokenizer"}')
    _refused(lambda: load_tokenizer(tmp_path / "junk.json"), "not a tokenizers JSON file")


_CHILD = """
import sys
from pathlib import Path
from contract.spec import SpecError
from contract.text import FillMaskCodec
try:
    FillMaskCodec(Path(sys.argv[1]), {"n": 8, "max_predictions": 1})
except SpecError as exc:
    print("refused:", exc)
"""


def test_a_tokenizer_fifo_never_freezes_the_process(
    tmp_path: Path, tiny_mlm_served: Path, fifos: Callable[[Path], Path]
) -> None:
    """The tokenizer library opens a path itself while holding the GIL: a FIFO there froze every
    thread of the process. Run in a child, so that a regression fails on the wait instead of
    freezing the test run."""
    fifo = fifos(tmp_path / "tokenizer.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(fifo)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("loading a tokenizer.json that is a FIFO blocked the process")
    assert child.returncode == 0, child.stderr
    assert "refused: tokenizer" in child.stdout and "a FIFO, not a regular file" in child.stdout
    # A real tokenizer, read from its bytes, still loads.
    assert load_tokenizer(tiny_mlm_served / "tokenizer.json").token_to_id("[MASK]") is not None
