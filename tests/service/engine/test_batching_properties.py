"""Properties of the dynamic batcher under random interleavings (hypothesis).

Random scripts of submits (good, poisoned, slow; with no, an expired, a short or a long
deadline), client cancellations, requests marked as arriving, pauses and a final `close()`, against
random batcher settings. Whatever the interleaving:

- every request gets exactly one outcome: its own result, its own error (only a poisoned input
  fails, and its batch-mates still succeed), 503 (queue full, closed), 504 (deadline), or the
  cancellation its client asked for; none is left hanging;
- a result always belongs to its own request;
- no request that had been withdrawn (its client cancelled it, or it timed out) or whose deadline
  had passed when a batch was taken is in it;
- the queue never holds more than its bound, no more batches run at once than the batcher has
  instances, and `close()` leaves nothing pending.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.errors import Closed, DeadlineExceeded, Overloaded
from service.engine.batcher import BatchObserver, DynamicBatcher
from service.engine.request_context import Deadline

pytestmark = pytest.mark.timeout(240)


@dataclass
class Request:
    index: int
    kind: str  # ok | poison | slow
    deadline: Deadline | None
    task: asyncio.Task[Any]
    cancelled_at: int | None = None  # event-loop step at which the client gave up


@dataclass
class Record:
    """What the batcher did, in event-loop steps (cancels and takes are both on the loop)."""

    step: itertools.count = field(default_factory=itertools.count)
    takes: list[tuple[int, float, list[int]]] = field(default_factory=list)  # (step, time, items)
    withdrawn: dict[int, int] = field(default_factory=dict)  # item -> step the batcher saw it go
    depths: list[int] = field(default_factory=list)
    run: list[list[int]] = field(default_factory=list)
    concurrent: int = 0  # batches inside the model now (worker threads)
    most_concurrent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class RecordingBatcher(DynamicBatcher[Any, Any]):
    """The real batcher; records each batch it takes, with the loop step and time it took it."""

    def __init__(self, record: Record, **kw: Any) -> None:
        super().__init__(self._model, **kw)
        self.record = record
        self.kinds: dict[int, str] = {}

    def _take_batch(self) -> list[Any]:
        step, now = next(self.record.step), time.monotonic()
        batch = super()._take_batch()
        self.record.takes.append((step, now, [p.item for p in batch]))
        return batch

    def _withdraw(self, pending: Any, reason: str) -> None:
        self.record.withdrawn.setdefault(pending.item, next(self.record.step))
        super()._withdraw(pending, reason)

    def _model(self, items: list[int]) -> list[Any]:
        record = self.record
        with record.lock:
            record.run.append(list(items))
            record.concurrent += 1
            record.most_concurrent = max(record.most_concurrent, record.concurrent)
        try:
            if any(self.kinds[i] == "slow" for i in items):
                time.sleep(0.002)
            if any(self.kinds[i] == "poison" for i in items):
                raise ValueError("poisoned input")
            return [("out", i) for i in items]
        finally:
            with record.lock:
                record.concurrent -= 1


class DepthObserver(BatchObserver):
    def __init__(self, record: Record) -> None:
        self.record = record

    def queue_depth(self, depth: int) -> None:
        self.record.depths.append(depth)


DEADLINES = {
    "none": lambda: None,
    "expired": lambda: Deadline(time.monotonic() - 1.0, 1.0),
    "short": lambda: Deadline.after(0.001),
    "long": lambda: Deadline.after(30.0),
}
OPERATIONS = st.one_of(
    st.tuples(
        st.just("submit"), st.sampled_from(["ok", "ok", "poison", "slow"]), st.sampled_from(sorted(DEADLINES))
    ),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("arrive"), st.booleans()),  # True: one more request on its way; False: one less
    st.tuples(st.just("pause"), st.sampled_from([0.0, 0.0, 0.0005, 0.002])),
)
SETTINGS = st.fixed_dictionaries(
    {
        "max_batch_size": st.integers(1, 5),
        "max_queue_size": st.integers(1, 6),
        "max_queue_delay_s": st.sampled_from([0.0, 0.001, 0.003]),
        "always_wait": st.booleans(),
        "instances": st.integers(1, 3),
    }
)


async def play(options: dict[str, Any], script: list[tuple[Any, ...]], close_timeout: float) -> None:
    record = Record()
    batcher = RecordingBatcher(record, name="prop", observers=[DepthObserver(record)], **options)
    batcher.start()
    requests: list[Request] = []
    arriving: list[AbstractContextManager[None]] = []
    for op in script:
        if op[0] == "submit":
            index = len(requests)
            batcher.kinds[index] = op[1]
            deadline = DEADLINES[op[2]]()
            task = asyncio.ensure_future(batcher.submit(index, deadline))
            requests.append(Request(index, op[1], deadline, task))
        elif op[0] == "cancel" and requests:
            request = requests[op[1] % len(requests)]
            if not request.task.done() and request.cancelled_at is None:
                request.cancelled_at = next(record.step)
                request.task.cancel()
        elif op[0] == "arrive":
            if op[1]:
                arriving.append(batcher.arriving())
                arriving[-1].__enter__()
            elif arriving:
                arriving.pop().__exit__(None, None, None)
        await asyncio.sleep(op[1] if op[0] == "pause" else 0)
    while arriving:
        arriving.pop().__exit__(None, None, None)
    await batcher.close(close_timeout)
    # Nothing may hang: every request has its outcome once close() returned.
    outcomes = await asyncio.wait_for(asyncio.gather(*(r.task for r in requests), return_exceptions=True), 10)
    check(options, record, requests, outcomes, batcher)


def check(
    options: dict[str, Any], record: Record, requests: list[Request], outcomes: list[Any], batcher: Any
) -> None:
    refusals = (Overloaded, Closed, DeadlineExceeded)
    for request, outcome in zip(requests, outcomes, strict=True):
        if isinstance(outcome, asyncio.CancelledError):
            assert request.cancelled_at is not None, f"request {request.index} cancelled by nobody"
        elif isinstance(outcome, ValueError):
            assert request.kind == "poison", (
                f"request {request.index} ({request.kind}) got a batch-mate's error"
            )
        elif isinstance(outcome, BaseException):
            assert isinstance(outcome, refusals), f"request {request.index}: unexpected {outcome!r}"
        else:
            assert outcome.output == ("out", request.index) and request.kind != "poison"
            assert outcome.queue_s >= 0 and outcome.run_s >= 0
    by_index = {r.index: r for r in requests}
    for step, taken_at, items in record.takes:
        for item in items:
            request = by_index[item]
            gone = record.withdrawn.get(item)
            assert gone is None or gone > step, f"{item} was taken after it was withdrawn"
            assert request.deadline is None or request.deadline.at > taken_at, f"{item} ran past its deadline"
    assert all(depth <= options["max_queue_size"] for depth in record.depths)
    assert all(len(batch) <= options["max_batch_size"] for batch in record.run)
    assert record.most_concurrent <= options["instances"]
    assert len(batcher.queue) == 0 and batcher.running_batches == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    options=SETTINGS,
    script=st.lists(OPERATIONS, max_size=40),
    close_timeout=st.sampled_from([0.0, 0.002, 1.0]),
)
def test_every_request_gets_exactly_its_own_outcome(
    options: dict[str, Any], script: list[tuple[Any, ...]], close_timeout: float
) -> None:
    asyncio.run(asyncio.wait_for(play(options, script, close_timeout), 60))
