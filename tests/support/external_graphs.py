"""Small real ONNX graphs whose tensors keep their bytes in external data, and the hostile places a
writer of the repository can point that data at: a path out of the directory, an absolute path,
`/dev/zero` with a terabyte's length, a symlink or hard link planted beside the graph to a file
outside it, a FIFO, an offset past the end of the file. Shared by the check's unit tests, the
servers' and the commands'.

Each `HOSTILE` maker writes such a graph as file `graph` of a directory (a served model's variant,
replaced) and returns the words the refusal must hold; the outside file it aims at
(`outside_file`) holds the very bytes the graph expects, so a runtime that followed the location
would load without complaint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

WEIGHTS = np.arange(4, dtype=np.float32) + 1  # the initializer w: y = x + w
INSIDE_NAME = "weights.bin"


def external_graph(
    path: Path, location: str, *, offset: int | None = None, length: int | None = None
) -> Path:
    """Write at `path` the graph y = x + w (x, y: float[4]) whose initializer w keeps its 16
    bytes in external data at `location` (with `offset` / `length` entries when given)."""
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": offset, "length": length}
    for key, value in entries.items():
        if value is not None:
            weight.external_data.add(key=key, value=str(value))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.unlink(missing_ok=True)  # a hard-linked copy of an export: never write through it
    path.write_bytes(model.SerializeToString())
    return path


def outside_file(root: Path) -> Path:
    """The file outside every model directory that the hostile graphs point at (made once per
    `root`), holding w's bytes; its access time set far back, so that any read of it shows."""
    path = root / "outside.bin"
    if not path.exists():
        path.write_bytes(WEIGHTS.tobytes())
        status = path.stat()
        os.utime(path, ns=(status.st_mtime_ns - 10**12, status.st_mtime_ns))
    return path


def untouched(path: Path) -> bool:
    """Whether `path` was never read since `outside_file` made it (relatime updates an access
    time older than the modification time on the first read)."""
    status = path.stat()
    return status.st_atime_ns < status.st_mtime_ns


Hostile = Callable[[Path, Path, str], str]  # (model directory, file outside it, graph) -> the words
INSIDE = "must be a path inside the model's directory"


def _dot_dot(directory: Path, outside: Path, graph: str) -> str:
    external_graph(directory / graph, os.path.relpath(outside, directory))
    return INSIDE


def _absolute(directory: Path, outside: Path, graph: str) -> str:
    external_graph(directory / graph, str(outside))
    return INSIDE


def _dev_zero(directory: Path, outside: Path, graph: str) -> str:
    external_graph(directory / graph, "/dev/zero", offset=0, length=10**12)
    return INSIDE


def _symlink(directory: Path, outside: Path, graph: str) -> str:
    (directory / INSIDE_NAME).symlink_to(outside)
    external_graph(directory / graph, INSIDE_NAME)
    return "resolves outside the model's directory"


def _hard_link(directory: Path, outside: Path, graph: str) -> str:
    os.link(outside, directory / INSIDE_NAME)
    external_graph(directory / graph, INSIDE_NAME)
    return "hard links to one file"


def _fifo(directory: Path, outside: Path, graph: str) -> str:
    os.mkfifo(directory / INSIDE_NAME)
    external_graph(directory / graph, INSIDE_NAME)
    return "a FIFO, not a regular file"


def _past_the_end(directory: Path, outside: Path, graph: str) -> str:
    (directory / INSIDE_NAME).write_bytes(WEIGHTS.tobytes())
    external_graph(directory / graph, INSIDE_NAME, offset=8, length=16)
    return "offset 8 and length 16 reach past its end (16 bytes)"


HOSTILE: dict[str, Hostile] = {
    "dot-dot": _dot_dot,
    "absolute": _absolute,
    "dev-zero": _dev_zero,
    "symlink": _symlink,
    "hard-link": _hard_link,
    "fifo": _fifo,
    "past-the-end": _past_the_end,
}
