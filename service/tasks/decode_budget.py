"""How many pixels the whole process decodes at once (`max_decoding_pixels`).

Each image is within `max_image_pixels`, but decodes run in worker threads side by side: a v2
request of 16 rows of large, highly compressed PNGs (a few hundred kilobytes in all), or as many
/classify requests, would each hold a decoded image of up to tens of millions of pixels at once,
as many as the thread pool has workers (up to 32). So a decode of more than a few thousand pixels
first takes its pixel count from this budget and gives it back when done; an image that does not
fit waits (within its request's deadline: 504 after) until decodes in flight finish. An image over
the whole budget waits until it runs alone. One budget per event loop: in a server, the process.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from PIL import Image

from contract.image import ImageTransform
from contract.jpeg import PlainJpeg


class PixelBudget:
    """A counting semaphore weighted by pixels, on one event loop."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.waiters: list[asyncio.Future[None]] = []

    @asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        """Hold `pixels` of the budget (at most all of it) for the duration of the block."""
        pixels = min(pixels, self.capacity)
        while self.used + pixels > self.capacity:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                self.waiters.remove(waiter)
        self.used += pixels
        try:
            yield
        finally:
            self.used -= pixels
            for waiter in self.waiters:  # each rechecks whether it fits now
                if not waiter.done():
                    waiter.set_result(None)


_BUDGETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, PixelBudget]] = (
    weakref.WeakKeyDictionary()
)


def decode_budget(capacity: int) -> PixelBudget:
    """The running loop's budget of `capacity` pixels (shared by every model it serves)."""
    per_loop = _BUDGETS.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(capacity, PixelBudget(capacity))


async def decode_in_thread(
    transform: ImageTransform, img: PlainJpeg | Image.Image, capacity: int
) -> np.ndarray:
    """`transform.finish(img)` (decode, resize, crop) in a worker thread, within the running loop's
    budget of `capacity` pixels in decoding."""
    async with decode_budget(capacity).hold(img.width * img.height):
        return await asyncio.to_thread(transform.finish, img)
