"""The size of a v2 answer, known from its outputs' element counts before the answer is built.

A few bytes of request can ask for a great deal of answer: sixteen texts of twenty [MASK]s each,
with `outputs: [logits]`, make 320 rows of a whole vocabulary's scores, about 20 bytes per number
as JSON (Python's shortest repr of a float32 widened to a double). So before a transport encodes
an answer, `check_answer` bounds it from the outputs alone: each JSON output at the widest form
its datatype's elements take (`JSON_ELEMENT_BYTES`; a BYTES element at six bytes of JSON per byte,
`\\u00XX`), each raw output (binary tensor data extension, gRPC raw contents) at its exact size.
An answer over `max_response_bytes` as JSON is refused with a message that names the binary
extension, which carries the same tensors in 4 bytes per float32; one over
`max_binary_response_bytes` as raw bytes is refused too. Transport-free: REST and gRPC both call it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contract.errors import ErrorCode, InputTooLarge
from contract.tensors import BYTES, NUMPY_TYPES, Tensor

# The widest JSON text of one element, with its separating comma, as `Tensor.json_data` and
# `json.dumps` write it: a float (FP16/32/64 all become doubles) is at most 24 characters of repr
# ("-2.2250738585072014e-308"), an integer its decimal digits and sign.
JSON_ELEMENT_BYTES: dict[str, int] = {
    "BOOL": 6,
    "UINT8": 4,
    "INT8": 5,
    "UINT16": 6,
    "INT16": 7,
    "UINT32": 11,
    "INT32": 12,
    "UINT64": 21,
    "INT64": 21,
    "FP16": 25,
    "FP32": 25,
    "FP64": 25,
}
# A BYTES element in JSON: each byte at most six characters (an escape), plus quotes and comma.
_JSON_BYTES_PER_BYTE, _JSON_STRING_OVERHEAD = 6, 3
# The envelope of one output (name, datatype, shape, keys) and of the answer, generously.
_OUTPUT_ENVELOPE, _ANSWER_ENVELOPE = 128, 256

BINARY_HINT = (
    "ask for big tensors as binary data: the binary tensor data extension (output parameter "
    '"binary_data": true, or request parameter "binary_data_output": true) carries 4 bytes per FP32 value'
)


@dataclass(frozen=True)
class AnswerSize:
    """Upper bounds of an answer's two parts, in bytes."""

    json: int  # the JSON document (every output not sent raw, and the envelope)
    raw: int  # the raw tensor bytes that follow it (or make up a gRPC answer)

    @property
    def total(self) -> int:
        return self.json + self.raw


def all_raw(name: str) -> bool:
    """Every output as raw bytes (gRPC's raw contents)."""
    return True


def raw_bytes(tensor: Tensor) -> int:
    """The exact size of `Tensor.raw()`: elements x item size; a BYTES element 4 + its length."""
    if tensor.datatype == BYTES:
        return sum(4 + len(item) for item in tensor.array.ravel())
    return int(tensor.array.size) * NUMPY_TYPES[tensor.datatype].itemsize


def json_bytes(tensor: Tensor) -> int:
    """An upper bound of the size of `Tensor.json_data()` once encoded (the list's brackets too)."""
    if tensor.datatype == BYTES:
        items = tensor.array.ravel()
        strings = sum(_JSON_BYTES_PER_BYTE * len(item) for item in items) + _JSON_STRING_OVERHEAD * len(items)
        return 2 + strings
    return 2 + int(tensor.array.size) * JSON_ELEMENT_BYTES[tensor.datatype]


def answer_size(outputs: Sequence[Tensor], is_raw: Callable[[str], bool], envelope: int = 0) -> AnswerSize:
    """Bounds of an answer whose outputs named by `is_raw` go as raw bytes, the others as JSON;
    `envelope`: the length of the answer's own strings (model name, id), escapes included."""
    json_size, raw_size = _ANSWER_ENVELOPE + 6 * envelope, 0
    for tensor in outputs:
        json_size += _OUTPUT_ENVELOPE + 6 * len(tensor.name) + 21 * len(tensor.shape)
        if is_raw(tensor.name):
            raw_size += raw_bytes(tensor)
        else:
            json_size += json_bytes(tensor)
    return AnswerSize(json_size, raw_size)


def check_answer(size: AnswerSize, max_json: int, max_raw: int) -> None:
    """Refuse an answer over either limit, saying which, by how much, and what to do instead."""
    if size.json > max_json:
        raise InputTooLarge(
            ErrorCode.RESPONSE_TOO_LARGE,
            f"the outputs asked for would make a JSON answer of up to {size.json} bytes; at most {max_json} "
            f"are sent as JSON (max_response_bytes): {BINARY_HINT}, or ask for fewer outputs or rows",
        )
    if size.raw > max_raw:
        raise InputTooLarge(
            ErrorCode.RESPONSE_TOO_LARGE,
            f"the outputs asked for are {size.raw} bytes of tensor data; at most {max_raw} are sent in one "
            "answer (max_binary_response_bytes): ask for fewer outputs or rows per request",
        )


__all__ = [
    "AnswerSize",
    "BINARY_HINT",
    "JSON_ELEMENT_BYTES",
    "all_raw",
    "answer_size",
    "check_answer",
    "json_bytes",
    "raw_bytes",
]
