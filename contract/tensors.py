"""The Open Inference Protocol's tensors, transport-free: datatypes, JSON data, raw bytes.

REST (JSON `data` or the binary tensor data extension) and gRPC (typed `contents` or
`raw_input_contents`) carry the same tensors in different envelopes; both transports decode into
`Tensor` here and encode from it, so a tensor means the same thing whichever way it came. Raw bytes
are little-endian and row-major; a `BYTES` element is a 4-byte little-endian length followed by its
bytes, in JSON a string. Every malformed tensor is an `InvalidInput` that names the tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.errors import ErrorCode, InvalidInput
from contract.messages import echo

# The protocol's datatypes that numpy represents exactly (BF16 has no numpy type: refused).
NUMPY_TYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BYTES = "BYTES"
DATATYPES: tuple[str, ...] = (*NUMPY_TYPES, BYTES)
# Shape limits, checked in Python integers before numpy sees a shape: at most MAX_DIMS dimensions
# (the models take 2 to 4; numpy itself stops at 64), and the product of the non-zero dimensions
# at most MAX_ELEMENTS (so that no dimension exceeds it either, and an empty tensor such as
# [2**64, 0] cannot overflow numpy's size arithmetic; any tensor a body within the upload limit can
# carry is far smaller).
MAX_DIMS = 16
MAX_ELEMENTS = 2**31 - 1
SHAPE_LIMITS = (
    f"at most {MAX_DIMS} dimensions, each >= 0, the non-zero ones multiplying to at most {MAX_ELEMENTS}"
)
# What JSON `data` may hold per datatype: integers for the integer types, integers or decimals
# for the floating ones, true/false for BOOL, strings for BYTES; never null, nor a string or a
# boolean for a number.
_JSON_KINDS: dict[str, tuple[type, ...]] = {
    **{
        name: (bool,) if name == "BOOL" else (int, float) if dtype.kind == "f" else (int,)
        for name, dtype in NUMPY_TYPES.items()
    },
    BYTES: (str,),
}
_BY_NUMPY = {dtype.newbyteorder("="): name for name, dtype in NUMPY_TYPES.items()}
_LENGTH = struct.Struct("<I")


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name for a numpy dtype (ONNX Runtime's outputs)."""
    name = _BY_NUMPY.get(dtype.newbyteorder("="))
    if name is None:
        raise ValueError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")
    return name


@dataclass(frozen=True)
class Tensor:
    """A named tensor: numeric tensors as numpy arrays, BYTES tensors as object arrays of bytes."""

    name: str
    datatype: str
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)

    def raw(self) -> bytes:
        """The tensor as the protocol's raw bytes (binary extension, gRPC raw contents)."""
        if self.datatype == BYTES:
            return b"".join(_LENGTH.pack(len(item)) + item for item in self.array.ravel())
        return np.ascontiguousarray(self.array, dtype=NUMPY_TYPES[self.datatype]).tobytes()

    def json_data(self, start: int = 0, stop: int | None = None) -> list[Any]:
        """Row-major flat data for JSON (elements `start` to `stop`, for an answer written slice by
        slice): numbers, booleans, or (BYTES) UTF-8 strings. JSON has no NaN or Infinity: a
        non-finite element is null, as JavaScript's JSON.stringify writes it (numpy reads null back
        as NaN); the binary form carries the exact values."""
        flat = self.array.ravel()[start:stop]
        if self.datatype == BYTES:
            return [item.decode("utf-8", errors="replace") for item in flat]
        if flat.dtype.kind == "f" and not np.isfinite(flat).all():
            return [x if math.isfinite(x) else None for x in flat.tolist()]
        return flat.tolist()


def _check_header(name: str, datatype: str, shape: Sequence[int]) -> int:
    """Validate datatype and shape; the element count."""
    if datatype not in DATATYPES:
        raise InvalidInput(
            ErrorCode.INVALID_DATATYPE,
            f"input {name}: datatype {echo(datatype)} is not one of {', '.join(DATATYPES)}",
        )
    # Python integers throughout: a client's absurd shape must not overflow int64.
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape) or math.prod(d for d in shape if d) > MAX_ELEMENTS:
        shown = list(shape) if len(shape) <= MAX_DIMS else f"of {len(shape)} dimensions"
        raise InvalidInput(ErrorCode.INVALID_SHAPE, f"input {name}: shape {shown} is refused: {SHAPE_LIMITS}")
    return math.prod(shape)


def _mismatch(name: str, shape: Sequence[int], got: str) -> InvalidInput:
    return InvalidInput(
        ErrorCode.INVALID_TENSOR_DATA, f"input {name}: shape {list(shape)} does not match {got}"
    )


def from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """A tensor from JSON `data`: a flat or nested row-major list (BYTES: strings)."""
    count = _check_header(name, datatype, shape)
    flat = _flatten(data)
    _check_kinds(name, datatype, flat)
    if datatype == BYTES:
        return from_items(name, shape, [item.encode("utf-8") for item in flat])
    if len(flat) != count:
        raise _mismatch(name, shape, f"{len(flat)} elements")
    dtype = NUMPY_TYPES[datatype]
    try:
        with np.errstate(over="raise"):
            array = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise InvalidInput(
            ErrorCode.INVALID_TENSOR_DATA,
            f"input {name}: data are not {datatype} values (a value out of its range, or nested "
            f"unevenly: {exc})",
        ) from None
    return Tensor(name, datatype, array.reshape(shape))


_EXPECTED: dict[tuple[type, ...], str] = {(bool,): "true or false", (int,): "integers", (str,): "strings"}


def _check_kinds(name: str, datatype: str, flat: list[Any]) -> None:
    """Every element of the JSON `data` a value of `datatype`'s kind; else name the first that is not
    (numpy would take null as NaN, true as 1 and "5" as 5)."""
    kinds = _JSON_KINDS[datatype]
    if all(kind in kinds for kind in set(map(type, flat))):
        return
    index, item = next((i, x) for i, x in enumerate(flat) if type(x) not in kinds)
    expected = _EXPECTED.get(kinds, "numbers")
    raise InvalidInput(
        ErrorCode.INVALID_TENSOR_DATA,
        f"input {name}: element {index} is {_json_kind(item)}; {datatype} data must be {expected}",
    )


def _json_kind(item: Any) -> str:
    """An element as JSON names it (nothing of a client's string is echoed)."""
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | float):
        return repr(item)[:32]
    names: dict[type, str] = {str: "a string", dict: "an object", bytes: "bytes"}
    return names.get(type(item), type(item).__name__)


def _flatten(data: Any) -> list[Any]:
    """The elements of flat or nested `data`, row-major (a flat list as it is, not copied)."""
    if not isinstance(data, list):
        return [data]
    if list not in set(map(type, data)):
        return data
    flat: list[Any] = []
    for item in data:
        if isinstance(item, list):
            flat.extend(_flatten(item))
        else:
            flat.append(item)
    return flat


def from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """A tensor from the protocol's raw bytes."""
    count = _check_header(name, datatype, shape)
    if datatype == BYTES:  # each element: a 4-byte little-endian length, then its bytes
        items, offset = [], 0
        while offset < len(raw):
            if offset + _LENGTH.size > len(raw):
                raise InvalidInput(
                    ErrorCode.INVALID_TENSOR_DATA, f"input {name}: truncated BYTES element length"
                )
            (length,) = _LENGTH.unpack_from(raw, offset)
            offset += _LENGTH.size
            if offset + length > len(raw):
                raise InvalidInput(
                    ErrorCode.INVALID_TENSOR_DATA, f"input {name}: BYTES element runs past the data"
                )
            items.append(raw[offset : offset + length])
            offset += length
        return from_items(name, shape, items)
    dtype = NUMPY_TYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise _mismatch(name, shape, f"{len(raw)} bytes of {datatype}")
    return Tensor(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(shape))


def from_items(name: str, shape: Sequence[int], items: Sequence[bytes]) -> Tensor:
    """A BYTES tensor from its elements (gRPC's `bytes_contents`, decoded JSON strings, raw form)."""
    count = _check_header(name, BYTES, shape)
    if len(items) != count:
        raise _mismatch(name, shape, f"{len(items)} BYTES elements")
    return Tensor(name, BYTES, _bytes_array(list(items), shape))


def _bytes_array(items: list[bytes], shape: Sequence[int]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def bytes_tensor(name: str, items: Sequence[bytes], shape: Sequence[int] | None = None) -> Tensor:
    """A BYTES output tensor of `shape` (default: 1-D, one element per request row)."""
    return Tensor(name, BYTES, _bytes_array(list(items), [len(items)] if shape is None else shape))
