"""Dynamic batching: gather concurrent requests into one model run, off the event loop.

The batcher is generic over `run_batch(list_of_inputs) -> list_of_outputs` and knows nothing about
HTTP or ONNX, so it can be tested with a plain function and reused for any model. Policy (the one
Triton, Ray Serve and TorchServe share):

- requests wait in a bounded FIFO queue; a full queue rejects at once (`Overloaded`, shed load
  early instead of letting latency grow without bound);
- a batch runs at once with what is queued unless more requests are on their way: callers mark
  the time a request spends before it can be queued (decoding, tokenising) with `arriving()`,
  and only while some are, the loop waits for them, until `max_batch_size` requests wait or
  `max_queue_delay_s` has passed since the *first* waiting one. A lone request at low load runs
  without any delay; under load the queue that builds while a batch runs forms the next batch
  (as Triton does with a zero queue delay), topped up with requests about to arrive.
  `always_wait` restores the classic window: the first request always waits up to the delay;
- up to `instances` batches of a model run at once, each in a worker thread (Triton's execution
  instances; ONNX Runtime releases the GIL, and one session may be run from several threads);
  a batch is formed when an instance is free, so while all of them run, the queue builds the
  next batch, and the event loop stays free to accept and parse the next requests; what is
  queued when several instances are free is shared out among them;
- a request past its deadline fails with `DeadlineExceeded`; a cancelled request (client gone,
  deadline hit) is removed from the queue and never reaches `run_batch`;
- each request gets its own result; if a batch raises, its requests are retried one by one so one
  poisoned input cannot fail its batch-mates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, Protocol, TypeVar

from contract.errors import Closed, ErrorCode, Overloaded
from service.engine import request_context
from service.engine.request_context import Batched, BatchRun, Deadline, RequestContext

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - the conventional name for an input type
O = TypeVar("O")  # noqa: E741


class BatchObserver:
    """What the batcher reports to its observers (`service.telemetry`: metrics, tracing): the queue
    depth and each refusal as they happen, and `batch_done` once per executed batch. Every report
    is a no-op here; an observer overrides the ones it needs."""

    def queue_depth(self, depth: int) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def batch_done(self, run: BatchRun) -> None:
        pass


I_contra = TypeVar("I_contra", contravariant=True)


class RowQueue(Protocol[I_contra, O]):
    """What a model hands its rows to: its `DynamicBatcher` where its session runs, or in a
    front-end process the link to the engine process that batches them
    (`service.processes.front`). The batching settings are what a model's description shows."""

    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    always_wait: bool
    instances: int

    def arriving(self) -> AbstractContextManager[None]: ...

    async def submit(self, item: I_contra, deadline: Deadline | None = None) -> Batched[O]: ...

    def start(self) -> None: ...

    async def close(self, timeout: float | None = None) -> None: ...


@dataclass(eq=False)
class _Pending(Generic[I, O]):
    item: I
    future: asyncio.Future[Batched[O]]
    enqueued: float = field(default_factory=time.monotonic)
    deadline: Deadline | None = None
    # The request this row belongs to, for the batch's span (tracing).
    request: RequestContext | None = field(default_factory=request_context.current)


@dataclass(eq=False)
class DynamicBatcher(Generic[I, O]):
    """One model's queue: concurrently `submit`ted items in batches for `run_batch`, each with its
    own deadline, result and times (`Batched`), by the module docstring's policy."""

    run_batch: Callable[[list[I]], list[O]]
    _: KW_ONLY
    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    name: str = "model"
    observers: Sequence[BatchObserver] = ()
    always_wait: bool = False
    instances: int = 1

    def __post_init__(self) -> None:
        if min(self.max_batch_size, self.max_queue_size, self.instances) < 1 or self.max_queue_delay_s < 0:
            raise ValueError(
                "max_batch_size, max_queue_size and instances must be >= 1, max_queue_delay_s >= 0"
            )
        self.queue: deque[_Pending[I, O]] = deque()  # waiting, oldest first
        self.running_batches = 0  # batches being run now
        self.arriving_now = 0  # requests inside `arriving()`, to be submitted next
        self.accepting = False
        self._tasks: list[asyncio.Task[None]] = []  # one loop per instance
        self._wakeup, self._idle = asyncio.Event(), asyncio.Event()  # made again by `start`, on its loop
        # One thread per instance: a batch never waits for a thread, only for a free instance.
        self._executor = ThreadPoolExecutor(self.instances, thread_name_prefix=f"batch-{self.name}")

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if self._tasks:
            return
        self._wakeup, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self.accepting = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._loop(i), name=f"batcher-{self.name}-{i}") for i in range(self.instances)
        ]

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting; wait (at most `timeout` s) until queued and running requests finished, the
        queued ones flushed without waiting for the batching window (no batch-mates can arrive any
        more); then stop the loop: requests still waiting fail with Closed."""
        self.accepting = False
        if self._tasks:
            self._wakeup.set()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        # A loop cancelled while its batch still runs answers that batch with the closing error.
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        while self.queue:
            pending = self.queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(self._closed())
        self._depth()
        self._executor.shutdown(wait=False, cancel_futures=True)

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request on its way to `submit` (being decoded): a forming batch may wait for it.

        Leave the block right before `submit` (no await in between), or on failure."""
        self.arriving_now += 1
        try:
            yield
        finally:
            self.arriving_now -= 1
            self._wakeup.set()  # a batch waiting for this request re-checks at once

    async def submit(self, item: I, deadline: Deadline | None = None) -> Batched[O]:
        """Queue `item` and wait for its result (with its queue wait and model run) until `deadline`.

        Raises Overloaded (queue full), DeadlineExceeded or Closed (not accepting); if the caller
        is cancelled (client disconnected) the item is withdrawn and never run.
        """
        if not self.accepting:
            self._rejected("shutting_down")
            raise Closed(
                ErrorCode.CLOSED, f"model {self.name} is not accepting requests (starting or shutting down)"
            )
        if len(self.queue) >= self.max_queue_size:
            self._rejected("queue_full")
            raise Overloaded(
                ErrorCode.OVERLOADED,
                f"the queue of model {self.name} is full ({self.max_queue_size} waiting)",
            )
        timeout = None if deadline is None else deadline.remaining()
        if deadline is not None and timeout is not None and timeout <= 0:
            self._rejected("deadline")
            raise deadline.exceeded()
        pending: _Pending[I, O] = _Pending(
            item, asyncio.get_running_loop().create_future(), deadline=deadline
        )
        self.queue.append(pending)
        self._idle.clear()
        self._depth()
        self._wakeup.set()
        try:
            # On timeout the scope cancels this task, and with it the awaited future, which
            # marks the request as abandoned for the loop.
            async with asyncio.timeout(timeout):
                return await pending.future
        except TimeoutError:
            self._withdraw(pending, "deadline")
            assert deadline is not None  # only a deadline times out
            raise deadline.exceeded() from None
        except asyncio.CancelledError:
            self._withdraw(pending, "cancelled")
            raise

    def _withdraw(self, pending: _Pending[I, O], reason: str) -> None:
        """Remove a request that gave up; counted as rejected only if it had not run yet."""
        pending.future.cancel()
        try:
            self.queue.remove(pending)
        except ValueError:  # already taken into a batch (its result is discarded) or finished
            if reason == "deadline":
                self._rejected(reason)
            return
        self._rejected(reason)
        self._depth()
        self._set_idle_if_done()

    async def _loop(self, instance: int) -> None:
        """One instance: form a batch, run it, and at once form the next.

        Each instance is its own loop so that a finished batch is followed by the next one in
        the same task, without another trip through the event loop's queue of ready callbacks
        (under load, each trip waits behind the parsing and decoding of many requests)."""
        while True:
            if not self.queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Wait for batch-mates on their way, until the batch is full or the head's window ends.
            while (
                self.queue
                and len(self.queue) < self.max_batch_size
                and self.accepting
                and (self.arriving_now > 0 or self.always_wait)
            ):
                remaining = self.queue[0].enqueued + self.max_queue_delay_s - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._wakeup.wait()
                except TimeoutError:
                    break
            batch = self._take_batch()
            if batch:
                await self._run(batch, instance)
            self._set_idle_if_done()

    def _batch_limit(self) -> int:
        """How many requests this instance takes: its share of the queue among the free instances.

        Requests that arrived together (a burst, or the queue that built while every instance
        was busy) are split over the instances free to take them rather than run on one while
        another idles: at c = 8 on two single-threaded instances, two batches of 4 side by side
        instead of one of 8 halve the time to the answers. Under steady load one instance
        frees at a time and takes up to `max_batch_size`."""
        free = max(1, self.instances - self.running_batches)
        return min(self.max_batch_size, -(-len(self.queue) // free))

    def _take_batch(self) -> list[_Pending[I, O]]:
        """Pop this instance's share of live requests (`_batch_limit`); cancelled ones are
        skipped, expired ones failed."""
        batch: list[_Pending[I, O]] = []
        now = time.monotonic()
        limit = self._batch_limit()
        while self.queue and len(batch) < limit:
            pending = self.queue.popleft()
            if pending.future.done():
                continue
            if pending.deadline is not None and pending.deadline.passed(now):
                pending.future.set_exception(pending.deadline.exceeded())
                self._rejected("deadline")
                continue
            batch.append(pending)
        self._depth()
        return batch

    async def _run(self, batch: list[_Pending[I, O]], instance: int = 0) -> None:
        start = time.monotonic()
        self.running_batches += 1
        # When the model run started and ended, as measured in its worker thread (0: it did not).
        timed, error = [0.0, 0.0], None
        try:
            await self._answer(batch, start, timed)
        except Exception as exc:
            error = exc
            if len(batch) == 1:
                _fail(batch[0], exc)
            else:
                log.warning(
                    "batch of %d failed on model %s (%r); retrying one by one", len(batch), self.name, exc
                )
                for pending in batch:
                    if not pending.future.done():
                        try:
                            await self._answer([pending], start, [0.0, 0.0])
                        except Exception as row_exc:
                            _fail(pending, row_exc)
        finally:
            # Closed while the batch ran (close() past its timeout): its requests get the closing
            # error now rather than hanging until their deadlines; without one they never would.
            for pending in batch:
                if not pending.future.done():
                    _fail(pending, self._closed())
            self.running_batches -= 1
            now = time.monotonic()
            rows = ([p.item for p in batch], [p.request for p in batch], [p.enqueued for p in batch])
            run = BatchRun(instance, *rows, start, timed[0] or start, timed[1] or now, now, error)
            for observer in self.observers:
                observer.batch_done(run)

    async def _answer(self, batch: list[_Pending[I, O]], start: float, timed: list[float]) -> None:
        """Run `batch` in a worker thread and answer each row with its times (raises what the run raised)."""
        items = [p.item for p in batch]
        outputs = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._run_checked, items, timed
        )
        for pending, output in zip(batch, outputs, strict=True):
            if not pending.future.done():  # else the requester gave up
                pending.future.set_result(Batched(output, start - pending.enqueued, timed[1] - timed[0]))

    def _run_checked(self, items: list[I], timed: list[float]) -> list[O]:
        timed[0] = time.monotonic()
        try:
            outputs = self.run_batch(items)
        finally:
            timed[1] = time.monotonic()
        if len(outputs) != len(items):
            raise RuntimeError(f"run_batch returned {len(outputs)} outputs for {len(items)} inputs")
        return outputs

    def _depth(self) -> None:
        for observer in self.observers:
            observer.queue_depth(len(self.queue))

    def _rejected(self, reason: str) -> None:
        for observer in self.observers:
            observer.rejected(reason)

    def _closed(self) -> Closed:
        return Closed(ErrorCode.CLOSED, f"model {self.name} is shutting down")

    def _set_idle_if_done(self) -> None:
        if not self.queue and not self.running_batches:
            self._idle.set()


def _fail(pending: _Pending[I, O], exc: BaseException) -> None:
    """Deliver an error unless the requester already gave up."""
    if not pending.future.done():
        pending.future.set_exception(exc)
