"""The tensors of an ONNX file that keep their bytes in another file (external data), found
without the `onnx` package (the serving image has none) and without trusting the file.

A `TensorProto` may leave its bytes out of the graph file: `data_location` EXTERNAL and
`external_data` entries `location` (a path relative to the graph file's directory), `offset` and
`length`. The runtimes open that path themselves, so a graph written by whoever can write to the
repository could name `../../etc/shadow`, an absolute path, `/dev/zero` with a length of a
terabyte, or a link planted beside it, and have its bytes read into a served model's weights
(ONNX's advisories CVE-2022-25882 and CVE-2024-27318; ONNX Runtime rejects only some of these,
and only in its recent releases). `external_tensors` finds every such tensor of a file and
`external_data_problems` decides whether each location is acceptable.

`external_tensors` walks the protobuf wire format of a `ModelProto` down to every `TensorProto` a
runtime may load: initializers and sparse initializers, tensors in node attributes, in subgraphs
(`If`, `Loop`, `Scan` bodies), in local functions and in training graphs. It seeks past everything
else, the weights' raw bytes included, so a graph of any size costs a few reads, and it parses
what protobuf's own parser accepts (unknown fields and groups skipped, a singular message given
twice merged, which it refuses where that could join two tensors' entries). The result is
cached by the file's identity and times, so the repository scan reads each graph once.

`external_data_problems` then holds each location to the rules of every file of a model directory
(`contract.files`: confined to the graph's directory, a regular file) and to two more a name
cannot show: a single link, and `offset` + `length` inside the file. `refuse_external_data` is
the door every runtime, command and check goes through before it opens a graph.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from contract.files import SpecError, confined, file_problem, open_regular

# The messages walked, and the fields of each that hold a message worth descending into
# (field numbers of onnx.proto).
_MODEL, _TRAINING, _GRAPH, _FUNCTION, _NODE, _ATTRIBUTE, _SPARSE, _TENSOR = range(8)
_CHILDREN: dict[int, dict[int, int]] = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
}
# Singular fields that hold a tensor: protobuf merges two occurrences into one message, which would
# join their external_data entries; no writer gives one twice, so it is refused.
_SINGULAR = {_ATTRIBUTE: {5, 22}, _SPARSE: {1, 2}}
_TENSOR_NAME, _TENSOR_ENTRY, _TENSOR_LOCATION = 8, 13, 14
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# Deeper than protobuf's own default recursion limit: such a file is no graph a runtime loads.
MAX_DEPTH = 100
# An entry's value longer than a path may be (PATH_MAX) is kept as None: refused, never read whole.
MAX_VALUE_BYTES = 4096
MAX_NAME_BYTES = 200  # of a tensor's name, as quoted in a reason
_CHUNK = 1 << 16


class GraphFormatError(ValueError):
    """The file is not a protobuf message a runtime could parse (truncated, a bad tag)."""


@dataclass(frozen=True)
class ExternalTensor:
    """A tensor that names external data: its name, and its `external_data` entries in file order
    (a value over `MAX_VALUE_BYTES` is None)."""

    name: str
    entries: tuple[tuple[bytes, bytes | None], ...]


class _Wire:
    """Protobuf's wire format over a file, read in chunks and seeking past what is skipped."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self._handle, self.size = handle, size
        self._buffer, self._start, self.position = b"", 0, 0

    def _at(self, count: int) -> int:
        """The buffer's index of `position`, with `count` bytes after it where the file has them."""
        index = self.position - self._start
        if index < 0 or index + count > len(self._buffer):
            self._handle.seek(self.position)
            self._buffer, self._start, index = self._handle.read(max(count, _CHUNK)), self.position, 0
        return index

    def varint(self, end: int) -> int:
        index, value = self._at(10), 0
        for shift in range(0, 70, 7):
            if self.position >= end or index >= len(self._buffer):
                raise GraphFormatError(f"truncated at byte {self.position:,}")
            byte = self._buffer[index]
            index, self.position = index + 1, self.position + 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
        raise GraphFormatError(f"a varint over 10 bytes at byte {self.position:,}")

    def tag(self, end: int) -> tuple[int, int]:
        key = self.varint(end)
        if key >> 3 == 0:
            raise GraphFormatError(f"field number 0 at byte {self.position:,}")
        return key >> 3, key & 7

    def length(self, end: int) -> int:
        """A length-delimited field's length, checked to fit inside its message."""
        length = self.varint(end)
        if self.position + length > end:
            raise GraphFormatError(f"a field of {length:,} bytes past its message at byte {self.position:,}")
        return length

    def take(self, length: int, most: int) -> bytes | None:
        """The next `length` bytes (already checked to fit), or None past `most` (skipped)."""
        if length > most:
            self.position += length
            return None
        index = self._at(length)
        data = self._buffer[index : index + length]
        if len(data) < length:
            raise GraphFormatError(f"truncated at byte {self.position:,}")
        self.position += length
        return data

    def skip(self, field: int, kind: int, end: int, depth: int = 0) -> None:
        """Past one field's value; a group (wire types 3 and 4) with everything in it, nested at
        most `MAX_DEPTH` deep as protobuf's parser allows."""
        if kind == 0:
            self.varint(end)
        elif kind in (1, 5):
            self.position += 8 if kind == 1 else 4
        elif kind == 2:
            length = self.length(end)  # read first: it moves the position
            self.position += length
        elif kind == 3:
            if depth >= MAX_DEPTH:
                raise GraphFormatError(f"groups nested more than {MAX_DEPTH} deep")
            while True:
                inner, inner_kind = self.tag(end)
                if inner_kind == 4:
                    if inner != field:
                        raise GraphFormatError(f"a group ends with field {inner}, not {field}")
                    return
                self.skip(inner, inner_kind, end, depth + 1)
        else:
            raise GraphFormatError(f"wire type {kind} at byte {self.position:,}")
        if self.position > end:
            raise GraphFormatError(f"a field past its message at byte {self.position:,}")


def _entry(wire: _Wire, end: int) -> tuple[bytes, bytes | None]:
    """A StringStringEntryProto (key 1, value 2; the last of each wins, as in protobuf)."""
    key: bytes | None = b""
    value: bytes | None = b""
    while wire.position < end:
        field, kind = wire.tag(end)
        if field in (1, 2) and kind == 2:
            data = wire.take(wire.length(end), MAX_VALUE_BYTES)
            key, value = (data, value) if field == 1 else (key, data)
        else:
            wire.skip(field, kind, end)
    return key if key is not None else b"(a key over 4096 bytes)", value


def _tensor(wire: _Wire, end: int, found: list[ExternalTensor]) -> None:
    name: bytes | None = b""
    entries: list[tuple[bytes, bytes | None]] = []
    external = False
    while wire.position < end:
        field, kind = wire.tag(end)
        if field == _TENSOR_NAME and kind == 2:
            length = wire.length(end)
            name = wire.take(min(length, MAX_NAME_BYTES), MAX_NAME_BYTES)
            wire.position += length - min(length, MAX_NAME_BYTES)
        elif field == _TENSOR_ENTRY and kind == 2:
            length = wire.length(end)
            entries.append(_entry(wire, wire.position + length))
        elif field == _TENSOR_LOCATION and kind == 0:
            external = wire.varint(end) == EXTERNAL
        else:
            wire.skip(field, kind, end)
    if entries or external:
        found.append(ExternalTensor((name or b"").decode("utf-8", "backslashreplace"), tuple(entries)))


def _message(wire: _Wire, kind_of: int, end: int, depth: int, found: list[ExternalTensor]) -> None:
    if depth > MAX_DEPTH:
        raise GraphFormatError(f"messages nested more than {MAX_DEPTH} deep")
    children, singular, seen = _CHILDREN[kind_of], _SINGULAR.get(kind_of, set()), set()
    while wire.position < end:
        field, kind = wire.tag(end)
        child = children.get(field)
        if child is None or kind != 2:
            wire.skip(field, kind, end)
            continue
        if field in singular:
            if field in seen:
                raise GraphFormatError(f"a tensor field ({field}) given twice in one message")
            seen.add(field)
        length = wire.length(end)
        child_end = wire.position + length
        if child == _TENSOR:
            _tensor(wire, child_end, found)
        else:
            _message(wire, child, child_end, depth + 1, found)
        wire.position = child_end


# A file's tensors, or why it is no protobuf message (the text: an exception would keep its frames).
_cache: OrderedDict[tuple[int, ...], tuple[ExternalTensor, ...] | str] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_ENTRIES = 256


def external_tensors(handle: BinaryIO) -> tuple[ExternalTensor, ...]:
    """Every tensor of the ONNX file open in `handle` (a regular file) that names external data;
    GraphFormatError when the file is no protobuf message. Cached by the file's device, inode,
    size and modification and change times (a rewrite changes the change time, which no writer
    can set back)."""
    status = os.fstat(handle.fileno())
    key = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    with _cache_lock:
        cached = _cache.get(key)
    if cached is None:
        found: list[ExternalTensor] = []
        try:
            _message(_Wire(handle, status.st_size), _MODEL, status.st_size, 1, found)
            cached = tuple(found)
        except GraphFormatError as exc:
            cached = str(exc)
        with _cache_lock:
            _cache[key] = cached
            while len(_cache) > _CACHE_ENTRIES:
                _cache.popitem(last=False)
    if isinstance(cached, str):
        raise GraphFormatError(cached)
    return cached


# The keys ONNX gives an external_data entry; ONNX Runtime refuses a graph with any other.
EXTERNAL_DATA_KEYS = frozenset({b"location", b"offset", b"length", b"checksum"})
MAX_EXTERNAL_PROBLEMS = 3  # quoted in a reason; the rest are counted
_File = tuple[Path, os.stat_result]  # an external data file and its status


def external_data_problems(graph: Path, what: str) -> list[str]:
    """Why the tensors of the ONNX file `graph` that keep their bytes in other files
    (`external_tensors`) cannot be loaded from them, or []. Each `location` must be
    `confined` to the graph's directory, the one the runtimes resolve it in (relative, no `..`,
    symlinks followed stay inside), and be a regular file (`file_problem`: a FIFO would block the
    load, `/dev/zero` never ends) with a single link: a hard link is a file from anywhere on the
    file system and nothing in the directory says so. `offset` and `length` are decimal and stay
    inside the file. Only `stat` is asked of a location, so nothing is read from one, whatever it
    is. SpecError when `graph` is not a regular file; GraphFormatError when it is no protobuf
    message (the runtime refuses that itself)."""
    with open_regular(graph, what, None) as handle:
        tensors = external_tensors(handle)
    files: dict[bytes, _File | str] = {}
    problems = []
    for tensor in tensors:
        problem = _external_problem(graph.parent, tensor, files)
        if problem is not None and problem not in problems:
            problems.append(problem)
    shown = [f"{what} {graph}: tensor {p}" for p in problems[:MAX_EXTERNAL_PROBLEMS]]
    if len(problems) > MAX_EXTERNAL_PROBLEMS:
        shown.append(f"and {len(problems) - MAX_EXTERNAL_PROBLEMS} more tensors' external data")
    return shown


def refuse_external_data(graph: Path, what: str) -> None:
    """SpecError unless `graph` is a regular ONNX file whose external data passes
    `external_data_problems`; the door of every runtime, command and check onto a graph."""
    try:
        problems = external_data_problems(graph, what)
    except GraphFormatError as exc:  # unsure what a runtime would make of it: refused
        raise SpecError(f"{what} {graph}: not an ONNX model a runtime can read ({exc})") from None
    if problems:
        raise SpecError("; ".join(problems))


def _external_file(directory: Path, location: bytes) -> _File | str:
    """The file an external data `location` names, with its status, or why it cannot be read."""
    name = os.fsdecode(location)
    try:
        path = confined(directory, name, "external data")
        status = os.stat(path)  # never opened: a FIFO or device is refused on its kind
    except SpecError as exc:
        return str(exc)
    except OSError as exc:
        return f"external data {name[:200]!r}: cannot be read ({exc.strerror or exc})"
    problem = file_problem(path, "external data", None, status)
    if problem is None and status.st_nlink > 1:
        problem = (
            f"external data {path}: {status.st_nlink} hard links to one file (a link can reach a "
            "file outside the model's directory unseen; copy the file in instead)"
        )
    return problem if problem is not None else (path, status)


def _external_problem(directory: Path, tensor: ExternalTensor, files: dict[bytes, _File | str]) -> str | None:
    """Why one tensor's external data cannot be loaded (`external_data_problems`), or None;
    `files` holds each location's `_external_file` once found."""
    label = f"{tensor.name!r}:"
    unknown = [key for key, _ in tensor.entries if key not in EXTERNAL_DATA_KEYS]
    if unknown:
        shown = unknown[0].decode("utf-8", "backslashreplace")[:60]
        return f"{label} external data key {shown!r} is not one of location, offset, length, checksum"
    found: _File | str = "external data without a location"
    for location in (value for key, value in tensor.entries if key == b"location"):
        # Every location is checked, though the runtimes read the last.
        if location is None:
            return f"{label} an external data location over {MAX_VALUE_BYTES} bytes"
        if location not in files:
            files[location] = _external_file(directory, location)
        found = files[location]
        if isinstance(found, str):
            break
    if isinstance(found, str):
        return f"{label} {found}"
    path, status = found
    values = dict(tensor.entries)  # the last of each key is the one the runtimes read
    offset, length = _bytes(values, b"offset"), _bytes(values, b"length")
    for name, number in (("offset", offset), ("length", length)):
        if isinstance(number, str):
            return f"{label} external data {name} {number} is not a decimal number of bytes"
    start, size = int(offset or 0), int(length or 0)
    if start + size > status.st_size:
        return (
            f"{label} external data {path}: offset {start:,} and length {size:,} reach past its "
            f"end ({status.st_size:,} bytes)"
        )
    return None


def _bytes(values: dict[bytes, bytes | None], key: bytes) -> int | str | None:
    """An entry's decimal value (None where absent), or the text it holds quoted, when it is not
    ASCII digits alone (the runtimes differ on signs, spaces and underscores: none is read)."""
    if key not in values:
        return None
    text = values[key]
    if text is None:
        return f"of over {MAX_VALUE_BYTES} bytes"
    if not (text.isdigit() and text.isascii()):
        return repr(text.decode("utf-8", "backslashreplace")[:40])
    return int(text)
