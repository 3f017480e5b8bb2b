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

from contract.errors import ErrorCode, InvalidInput, echo

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

    def json_data(self) -> list[Any]:
        """Row-major flat data for JSON: numbers, booleans, or (BYTES) UTF-8 strings."""
        if self.datatype == BYTES:
            return [item.decode("utf-8", errors="replace") for item in self.array.ravel()]
        return self.array.ravel().tolist()


def _check_header(name: str, datatype: str, shape: Sequence[int]) -> int:
    """Validate datatype and shape; the element count."""
    if datatype not in DATATYPES:
        raise InvalidInput(
            ErrorCode.INVALID_DATATYPE,
            f"input {name}: datatype {echo(datatype)} is not one of {', '.join(DATATYPES)}",
        )
    if any(d < 0 for d in shape):
        raise InvalidInput(
            ErrorCode.INVALID_SHAPE, f"input {name}: shape {list(shape)} has a negative dimension"
        )
    return math.prod(shape)  # Python integers: a client's absurd shape must not overflow int64


def _mismatch(name: str, shape: Sequence[int], got: str) -> InvalidInput:
    return InvalidInput(
        ErrorCode.INVALID_TENSOR_DATA, f"input {name}: shape {list(shape)} does not match {got}"
    )


def from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """A tensor from JSON `data`: a flat or nested row-major list (BYTES: strings)."""
    count = _check_header(name, datatype, shape)
    if datatype == BYTES:
        flat = _flatten(data)
        if not all(isinstance(item, str) for item in flat):
            raise InvalidInput(ErrorCode.INVALID_TENSOR_DATA, f"input {name}: BYTES data must be strings")
        return from_items(name, shape, [item.encode("utf-8") for item in flat])
    if datatype == "BOOL" and not all(isinstance(x, bool) for x in _flatten(data)):
        raise InvalidInput(ErrorCode.INVALID_TENSOR_DATA, f"input {name}: BOOL data must be true or false")
    try:
        array = np.asarray(data, dtype=NUMPY_TYPES[datatype])
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(
            ErrorCode.INVALID_TENSOR_DATA, f"input {name}: data are not {datatype} values ({exc})"
        ) from None
    if array.size != count:
        raise _mismatch(name, shape, f"{array.size} elements")
    return Tensor(name, datatype, array.reshape(shape))


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item))
    return flat


def from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """A tensor from the protocol's raw bytes."""
    count = _check_header(name, datatype, shape)
    if datatype == BYTES:
        return from_items(name, shape, split_bytes(name, raw))
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


def split_bytes(name: str, raw: bytes) -> list[bytes]:
    """BYTES elements from their raw form: 4-byte little-endian length, then the bytes, repeated."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + _LENGTH.size > len(raw):
            raise InvalidInput(ErrorCode.INVALID_TENSOR_DATA, f"input {name}: truncated BYTES element length")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + length > len(raw):
            raise InvalidInput(
                ErrorCode.INVALID_TENSOR_DATA, f"input {name}: BYTES element runs past the data"
            )
        items.append(raw[offset : offset + length])
        offset += length
    return items


def _bytes_array(items: list[bytes], shape: Sequence[int]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def bytes_tensor(name: str, items: Sequence[bytes], shape: Sequence[int] | None = None) -> Tensor:
    """A BYTES output tensor of `shape` (default: 1-D, one element per request row)."""
    return Tensor(name, BYTES, _bytes_array(list(items), [len(items)] if shape is None else shape))


__all__ = [
    "Tensor",
    "DATATYPES",
    "NUMPY_TYPES",
    "BYTES",
    "datatype_of",
    "from_json",
    "from_raw",
    "from_items",
    "split_bytes",
    "bytes_tensor",
]
