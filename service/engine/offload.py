"""CPU-heavy work of a request moved off the event loop, above a size where it would be felt.

Encoding a large answer (JSON of millions of numbers, or tens of megabytes of raw tensors) takes
tens to hundreds of milliseconds of CPU; on the event loop that is a pause for every other request
and probe of the process (`/health/live` included). Small answers, the common case, are encoded in
place: a thread hand-off costs more than they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Answers up to this many bytes (an upper bound of their encoded size) are encoded on the loop:
# about a millisecond of JSON encoding at most.
INLINE_ENCODE_BYTES = 64 * 1024


async def encode_off_loop(encode: Callable[[], T], size: int) -> T:
    """`encode()`, in a worker thread when `size` (its output's bound in bytes) is over
    `INLINE_ENCODE_BYTES`, else in place."""
    if size <= INLINE_ENCODE_BYTES:
        return encode()
    return await asyncio.to_thread(encode)


__all__ = ["INLINE_ENCODE_BYTES", "encode_off_loop"]
