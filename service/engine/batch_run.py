"""What the batcher tells its observers about one executed batch, beyond its size and times."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.engine.request_context import RequestContext


@dataclass
class RunClock:
    """When the model run of a batch started and ended, as measured in its worker thread."""

    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class BatchRun:
    """One executed batch, for observers that need its requests (tracing): the instance that ran
    it, its items, each row's `RequestContext` (None outside a request), when each row was
    queued, when the batch was formed and when the model run started and ended (all
    `time.monotonic()` instants), and the error the batch raised, if any."""

    instance: int
    items: list[Any]
    requests: list[RequestContext | None]
    enqueued: list[float]
    started: float
    run_start: float
    run_end: float
    error: BaseException | None = None

    @property
    def size(self) -> int:
        return len(self.items)

    @classmethod
    def of(
        cls, instance: int, batch: Sequence[Any], started: float, clock: RunClock, error: BaseException | None
    ) -> BatchRun:
        """The run of `batch` (the batcher's pending rows: `.item`, `.request`, `.enqueued`)."""
        return cls(
            instance,
            [p.item for p in batch],
            [p.request for p in batch],
            [p.enqueued for p in batch],
            started,
            clock.start or started,
            clock.end or time.monotonic(),
            error,
        )


__all__ = ["BatchRun", "RunClock"]
