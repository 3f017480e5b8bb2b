"""What one executed batch tells: its observers get a `BatchRun`, each request its `Batched` result."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.engine.request_context import RequestContext

O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True)
class Batched(Generic[O]):
    """A request's result from its batch, with where its time went: `queue_s` from enqueue to the
    batch's start, `run_s` the model run of the batch that answered it (what Server-Timing says)."""

    output: O
    queue_s: float
    run_s: float


@dataclass
class RunClock:
    """When the model run of a batch started and ended, as measured in its worker thread."""

    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class BatchRun:
    """One executed batch, the one event its observers get (metrics, tracing): the instance that
    ran it, its items, each row's `RequestContext` (None outside a request), when each row was
    queued, when the batch was formed, when the model run started and ended, when the batch was
    done (its rows answered, retried one by one if it failed; all `time.monotonic()` instants),
    and the error the batch raised, if any."""

    instance: int
    items: list[Any]
    requests: list[RequestContext | None]
    enqueued: list[float]
    started: float
    run_start: float
    run_end: float
    done: float
    error: BaseException | None = None

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def queue_waits(self) -> list[float]:
        """Each row's wait, from enqueue to the batch's start."""
        return [self.started - enqueued for enqueued in self.enqueued]

    @classmethod
    def of(
        cls, instance: int, batch: Sequence[Any], started: float, clock: RunClock, error: BaseException | None
    ) -> BatchRun:
        """The run of `batch` (the batcher's pending rows: `.item`, `.request`, `.enqueued`), done now."""
        now = time.monotonic()
        return cls(
            instance,
            [p.item for p in batch],
            [p.request for p in batch],
            [p.enqueued for p in batch],
            started,
            clock.start or started,
            clock.end or now,
            now,
            error,
        )


__all__ = ["BatchRun", "Batched", "RunClock"]
