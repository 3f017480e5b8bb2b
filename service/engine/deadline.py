"""A request's deadline: one value from arrival to answer (read, decode, queue, run).

It carries both the instant (for waiting) and the configured timeout (for the message the client
gets), so no layer passes the two separately.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from contract.errors import DeadlineExceeded, ErrorCode

T = TypeVar("T")


@dataclass(frozen=True)
class Deadline:
    at: float  # a time.monotonic() instant
    timeout_s: float

    @classmethod
    def after(cls, timeout_s: float) -> Deadline:
        return cls(time.monotonic() + timeout_s, timeout_s)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def passed(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.at

    def exceeded(self) -> DeadlineExceeded:
        return DeadlineExceeded(
            ErrorCode.TIMEOUT, f"the request did not complete within its deadline of {self.timeout_s:g} s"
        )


async def before(work: Awaitable[T], deadline: Deadline) -> T:
    """Await `work` until `deadline`; DeadlineExceeded after.

    Used for the steps before the batcher (reading the body, decoding); the batcher enforces the
    same deadline itself while the request is queued.
    """
    try:
        # A timeout scope, not wait_for: no extra task per step of every request.
        async with asyncio.timeout(max(0.0, deadline.remaining())):
            return await work
    except TimeoutError:
        raise deadline.exceeded() from None


__all__ = ["Deadline", "before"]
