"""JSON files handed to a command: bounded, deep-safe, refused in one line naming the file."""

from __future__ import annotations

import pytest

from contract.errors import UserError
from contract.json_file import read_json_file, read_json_object


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
    with pytest.raises(UserError, match="cannot read .*missing.json"):
        read_json_file(tmp_path / "missing.json")
