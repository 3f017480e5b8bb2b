"""What crosses between the engine and a front-end: arrays through a shared-memory arena (read in
another mapping, as the other process reads them), refusals, frames."""

from __future__ import annotations

import asyncio
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract import errors
from contract.errors import ErrorCode, RequestError
from service.processes.wire import (
    ALIGN,
    MAX_FRAME_BYTES,
    Arena,
    Mapped,
    Placed,
    frame,
    read_frame,
    refusal,
    refused,
)

pytestmark = pytest.mark.unit

SIZE = 64 * ALIGN


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20 * ALIGN), st.booleans()), max_size=40))
def test_blocks_never_overlap_and_all_come_back(steps: list[tuple[int, bool]]) -> None:
    """Arrays placed while others are held read back intact through another mapping; whatever the
    order of releases, the whole arena is one free block again at the end."""
    arena = Arena(f"gmlp-test-{os.getpid()}", SIZE)
    reader = Mapped(arena.name)
    held: list[tuple[dict[str, Placed | np.ndarray], np.ndarray]] = []
    try:
        for i, (nbytes, release_oldest) in enumerate(steps):
            array = np.full(nbytes, i % 251, dtype=np.uint8)
            placed = arena.place({"x": array})
            held.append((placed, array))
            if release_oldest and len(held) > 1:
                old, _ = held.pop(0)
                arena.release(old)
            for tensors, expected in held:
                np.testing.assert_array_equal(reader.view(tensors)["x"], expected)
        for tensors, _ in reversed(held):
            arena.release(tensors)
        assert arena._free == [(0, SIZE)]
    finally:
        reader.close()
        arena.close()


def test_what_does_not_fit_travels_inline() -> None:
    arena = Arena(f"gmlp-test-{os.getpid()}", SIZE)
    try:
        big = np.arange(SIZE, dtype=np.float32)  # four times the arena
        small = np.arange(8, dtype=np.int64)
        placed = arena.place({"big": big, "small": small, "objects": np.array(["a"], dtype=object)})
        assert placed["big"] is big and isinstance(placed["small"], Placed)
        assert isinstance(placed["objects"], np.ndarray)
        copied = Mapped(arena.name).copy(placed)
        np.testing.assert_array_equal(copied["small"], small)
        np.testing.assert_array_equal(copied["big"], big)
    finally:
        arena.close()


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_every_refusal_crosses_as_it_was_raised(code: ErrorCode) -> None:
    kind = code.error
    extra = {"retry_after_s": 7} if issubclass(kind, errors.Unavailable) else {}
    raised = kind(code, f"what was wrong with {code.name}", **extra)
    back = refused(refusal(raised))
    assert (type(back), back.code, back.message) == (kind, code, raised.message)
    assert getattr(back, "retry_after_s", None) == extra.get("retry_after_s")


def test_anything_else_crosses_as_an_internal_error_without_its_detail() -> None:
    back = refused(refusal(ZeroDivisionError("secret detail")))
    assert isinstance(back, RequestError) and back.code is ErrorCode.INTERNAL_ERROR
    assert "secret" not in back.message


def test_frames_round_trip_and_an_oversized_one_is_refused() -> None:
    async def read(data: bytes) -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader)

    message = ("done", 3, {"x": Placed(0, "<f4", (2, 3), 64)}, [{"label": "cat"}])
    assert asyncio.run(read(frame(message))) == message
    with pytest.raises(ConnectionError, match="more than a process of this server sends"):
        asyncio.run(read(struct.pack("!I", MAX_FRAME_BYTES + 1)))
