"""JSON files handed to a command: bounded, deep-safe, regular files only, refused in one line naming
the file; and parsed as the model repository's JSON files are."""

from __future__ import annotations

import os

import pytest

from contract.errors import UserError
from contract.json_file import MAX_JSON_FILE_BYTES, read_json_file, read_json_object
from contract.spec import read_json
from support.broken_dirs import outcome_within, release_readers


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested more than 64 deep"),
        (b'{"a": NaN}', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"a": 1e400}', "not a finite double"),
    ],
)
def test_malformed_files_are_one_line_user_errors(tmp_path, content: bytes, expected: str) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=expected) as refused:
        read_json_file(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "send" not in message


def test_size_kind_and_absence_are_refused(tmp_path) -> None:
    path = tmp_path / "f.json"
    path.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(UserError, match="larger than 64 bytes"):
        read_json_file(path, limit=64)
    assert len(read_json_file(path)) == 101
    with pytest.raises(UserError, match="must hold a JSON object, not an array"):
        read_json_object(path)
    with pytest.raises(UserError, match="missing.json: cannot be read"):
        read_json_file(tmp_path / "missing.json")


def test_a_fifo_is_refused_at_once(tmp_path) -> None:
    """Read as a regular file only: a FIFO named where a JSON file is expected ends in a one-line
    error at once, where a plain open waited for a writer that never comes."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    try:
        refused = outcome_within(lambda: read_json_file(fifo), 30)
    finally:
        release_readers([fifo])
    assert isinstance(refused, UserError), repr(refused)
    assert f"{fifo}: a FIFO, not a regular file" in str(refused) and "\n" not in str(refused)


@pytest.mark.parametrize(
    "content",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e400}',
        b'["\\ud800"]',
        b"\xef\xbb\xbf{}",
        b"[" * 65 + b"]" * 65,
        b"[" * 64 + b"]" * 64,
        b'{"labels": ["cat", "dog"]}',
    ],
)
def test_repository_files_and_command_files_are_read_by_one_parser(tmp_path, content: bytes) -> None:
    """A model's config.json, labels and policy (`contract.spec.read_json`) and a command's JSON
    file take and refuse the same documents, with the same words after the file's name."""
    path = tmp_path / "f.json"
    path.write_bytes(content)
    outcomes = []
    for read in (lambda: read_json_file(path), lambda: read_json(path, MAX_JSON_FILE_BYTES, "config")):
        try:
            outcomes.append(("document", read()))
        except UserError as exc:  # the command's: the same words, after the file's name
            outcomes.append(("refused", str(exc).removeprefix(f"{path}: ")))
        except ValueError as exc:  # the repository's reader: JSONError
            outcomes.append(("refused", str(exc)))
    assert outcomes[0] == outcomes[1]
