"""JSON files an operator hands a command (a checkpoint's config.json, a converter's constructor
arguments, class names, training records), read without trusting them.

`json.loads` recurses once per nesting level, so a file of 100,000 `[` ends in a RecursionError
traceback, and it reads a file of any size whole. Here the file is opened as every file of a model
directory is (`contract.files.open_regular`: a FIFO, socket or device is refused at once, where a
read would block the command, or a server's start-up export, for good), read up to a byte bound
and parsed by the one strict parser of every JSON door (`contract.strict_json`: nesting at most
64 deep, finite numbers, UTF-8), and every failure is a `UserError` of one line naming the file,
which the CLI prints as `gmlp <command>: error: ...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract import strict_json
from contract.errors import UserError
from contract.files import open_regular

# Far above any file of these kinds (a config.json is a few KiB, ImageNet-21k's 21,843 class names
# under 1 MiB) and far below what would cost the command real memory.
MAX_JSON_FILE_BYTES = 4 << 20


def read_json_file(path: str | Path, *, limit: int = MAX_JSON_FILE_BYTES) -> Any:
    """The JSON document in file `path` (at most `limit` bytes), or UserError saying why not."""
    path = Path(path)
    # Missing, unreadable or not a regular file: SpecError, a UserError naming the file.
    with open_regular(path, "JSON file", None) as handle:
        try:
            raw = handle.read(limit + 1)
        except OSError as exc:
            raise UserError(f"JSON file {path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise UserError(f"{path} is larger than {limit:,} bytes, more than a JSON file of this kind holds")
    try:
        return strict_json.loads_written(raw)
    except strict_json.JSONError as exc:
        raise UserError(f"{path}: {exc.message}") from None


def read_json_object(path: str | Path, *, limit: int = MAX_JSON_FILE_BYTES) -> dict[str, Any]:
    """`read_json_file` of a file that must hold a JSON object."""
    document = read_json_file(path, limit=limit)
    if not isinstance(document, dict):
        kinds: dict[type, str] = {list: "an array", str: "a string"}
        kind = kinds.get(type(document), "a number, boolean or null")
        raise UserError(f"{path} must hold a JSON object, not {kind}")
    return document
