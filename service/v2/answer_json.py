"""A v2 REST answer's JSON, written in slices so that encoding a big one never stalls the server.

`json.dumps` of one list holds the GIL from its first number to its last: on a list of millions of
numbers that is seconds in which no other thread runs, the event loop included, even when the
encoding itself runs in a worker thread. So an output's `data` is converted and encoded
`SLICE_ELEMENTS` at a time, and the GIL is free between slices. The text is exactly what
`json.dumps(document, separators=(",", ":"))` writes for the whole answer; `data` comes last in
each output, as it always has.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from contract.tensors import Tensor

# About a millisecond of conversion and encoding per slice.
SLICE_ELEMENTS = 8192


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_data(tensor: Tensor) -> str:
    """`json.dumps(tensor.json_data())`, slice by slice (each slice by `Tensor.json_data`, so the
    elements are written by the one rule, non-finite floats as null)."""
    size = int(tensor.array.size)
    slices = (tensor.json_data(i, i + SLICE_ELEMENTS) for i in range(0, size, SLICE_ELEMENTS))
    return "[" + ",".join(_dumps(values)[1:-1] for values in slices) + "]"


def answer_json(
    head: dict[str, Any], outputs: Sequence[Tensor], raw: Callable[[Tensor], dict[str, Any] | None]
) -> bytes:
    """The answer document: `head` (model name, version, id), then each output's metadata and
    either the parameters `raw` gives it (an output sent as binary data) or its JSON `data`.

    An answer of at most `SLICE_ELEMENTS` numbers, the usual case, is encoded in one call."""
    entries: list[dict[str, Any]] = []
    sliced: dict[int, Tensor] = {}  # entries whose data is written slice by slice
    small = sum(int(tensor.array.size) for tensor in outputs) <= SLICE_ELEMENTS
    for tensor in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        parameters = raw(tensor)
        if parameters is not None:
            entry["parameters"] = parameters
        elif small:
            entry["data"] = tensor.json_data()
        else:
            sliced[len(entries)] = tensor
        entries.append(entry)
    if not sliced:
        return _dumps({**head, "outputs": entries}).encode()
    texts = [
        _dumps(entry)[:-1] + ',"data":' + json_data(sliced[i]) + "}" if i in sliced else _dumps(entry)
        for i, entry in enumerate(entries)
    ]
    return (_dumps(head)[:-1] + ',"outputs":[' + ",".join(texts) + "]}").encode()
