"""The dynamic batcher on its own, with plain Python functions as `run_batch` (a real component).

A `threading.Event` "gate" holds a batch in the worker thread so that queue states (full, waiting,
cancelled) are reached deterministically rather than by timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import pytest

from contract.errors import Closed, DeadlineExceeded, Overloaded
from service.engine import request_context
from service.engine.batcher import BatchObserver, DynamicBatcher
from service.engine.request_context import BatchRun, Deadline

pytestmark = pytest.mark.timeout(60)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


class Recorder(BatchObserver):
    """Observer that remembers what the batcher reported."""

    def __init__(self) -> None:
        self.depths: list[int] = []
        self.rejections: Counter[str] = Counter()
        self.batches: list[int] = []
        self.runs: list[BatchRun] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def rejected(self, reason: str) -> None:
        self.rejections[reason] += 1

    def batch_done(self, run: BatchRun) -> None:
        assert len(run.enqueued) == run.size and run.done >= run.run_end >= run.run_start
        self.batches.append(run.size)
        self.runs.append(run)


class GatedModel:
    """run_batch that records its batches and can be held closed by a gate."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        assert self.gate.wait(20), "gate never opened"
        if "bad" in items:
            raise ValueError("poisoned input")
        return [f"out-{item}" for item in items]

    @property
    def seen(self) -> list[Any]:
        return [item for batch in self.batches for item in batch]


async def until(condition: Any, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def make(model: GatedModel, **kw: Any) -> tuple[DynamicBatcher[Any, Any], Recorder]:
    recorder = Recorder()
    options = {"max_batch_size": 4, "max_queue_delay_s": 0.05, "max_queue_size": 100, **kw}
    return DynamicBatcher(model, observers=[recorder], name="test", **options), recorder


async def answer(batcher: DynamicBatcher[Any, Any], item: Any, deadline: Deadline | None = None) -> Any:
    """The output `submit` returns for `item` (without its times)."""
    return (await batcher.submit(item, deadline)).output


async def held_batcher(model: GatedModel, **settings: Any) -> tuple[Any, Any, asyncio.Future]:
    """A started one-at-a-time batcher whose worker holds request "a" behind the model's closed gate."""
    model.gate.clear()
    batcher, recorder = make(model, max_batch_size=1, max_queue_delay_s=0.0, **settings)
    batcher.start()
    first = asyncio.ensure_future(answer(batcher, "a"))
    await until(lambda: batcher.running_batches == 1)  # "a" is in the worker, held by the gate
    return batcher, recorder, first


def test_concurrent_requests_are_batched_and_each_gets_its_own_result() -> None:
    model = GatedModel()

    async def main() -> list[Any]:
        batcher, recorder = make(model, max_batch_size=4, max_queue_delay_s=1.0)
        batcher.start()
        results = await asyncio.gather(*(answer(batcher, i) for i in range(10)))
        await batcher.close(5)
        assert recorder.batches == [len(b) for b in model.batches]
        return results

    results = run(main())
    assert results == [f"out-{i}" for i in range(10)]
    # All ten were queued before the loop ran: full batches, then the rest (nobody else is coming).
    assert [len(b) for b in model.batches] == [4, 4, 2]
    assert sorted(model.seen) == list(range(10))


def test_each_batch_reports_its_requests_and_their_share_of_the_time() -> None:
    """What tracing reads (the requests a batch served, when each was queued, the instance, the
    model run's times, an error the batch raised) and what each request gets back: its queue wait
    and the model run that answered it (Server-Timing)."""
    model = GatedModel()
    contexts = [request_context.RequestContext(f"r{i}", "test") for i in range(3)]

    async def one(i: int, item: str) -> Any:
        with request_context.open_request(contexts[i]):
            return await batcher.submit(item)

    async def main() -> list[Any]:
        batcher.start()
        results = await asyncio.gather(*(one(i, x) for i, x in enumerate(("a", "b", "c"))))
        retried = await asyncio.gather(
            *(one(i, x) for i, x in enumerate(("a", "bad", "c"))), return_exceptions=True
        )
        await batcher.close(5)
        return [*results, *retried]

    batcher, recorder = make(model, max_batch_size=3, max_queue_delay_s=1.0, always_wait=True)
    a, b, c, retried_a, bad, retried_c = run(main())
    good, failed = recorder.runs
    assert good.size == 3 and good.items == ["a", "b", "c"] and good.instance == 0 and good.error is None
    assert failed.items == ["a", "bad", "c"] and isinstance(failed.error, ValueError)
    assert good.requests == contexts == failed.requests
    for batch in (good, failed):
        assert all(e <= batch.started <= batch.run_start <= batch.run_end for e in batch.enqueued)
    for answered, enqueued in zip((a, b, c), good.enqueued, strict=True):
        assert answered.queue_s == pytest.approx(good.started - enqueued)
        assert answered.run_s == pytest.approx(good.run_end - good.run_start) and answered.run_s > 0
    # Retried one by one after the batch failed: each answer's run is its own retry.
    assert isinstance(bad, ValueError) and [retried_a.output, retried_c.output] == ["out-a", "out-c"]
    for answered, enqueued in ((retried_a, failed.enqueued[0]), (retried_c, failed.enqueued[2])):
        assert answered.queue_s == pytest.approx(failed.started - enqueued) and answered.run_s > 0


def test_lone_request_does_not_wait_for_batch_mates_that_are_not_coming() -> None:
    model = GatedModel()

    async def main() -> Any:
        # A window longer than run()'s 30 s limit: waiting for it would fail the test.
        batcher, recorder = make(model, max_queue_delay_s=60.0)
        batcher.start()
        result = await answer(batcher, "x")
        await batcher.close(5)
        return result, recorder.batches

    assert run(main()) == ("out-x", [1])
    assert model.batches == [["x"]]


def test_a_batch_waits_for_requests_on_their_way() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, _ = make(model, max_queue_delay_s=60.0)
        batcher.start()
        decoded = {"b": asyncio.Event(), "c": asyncio.Event()}

        async def request(item: str) -> Any:
            with batcher.arriving():  # being decoded
                await decoded[item].wait()
            return await answer(batcher, item)  # submitted as its block closes, as the pipelines do

        second, third = asyncio.ensure_future(request("b")), asyncio.ensure_future(request("c"))
        await asyncio.sleep(0)
        first = asyncio.ensure_future(answer(batcher, "a"))
        for _ in range(20):  # give the loop every chance to run "a" alone
            await asyncio.sleep(0)
        assert model.batches == [] and len(batcher.queue) == 1 and batcher.arriving_now == 2
        decoded["b"].set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert model.batches == [] and len(batcher.queue) == 2  # "c" is still on its way
        decoded["c"].set()
        assert await asyncio.gather(first, second, third) == ["out-a", "out-b", "out-c"]
        await batcher.close(5)

    run(main())
    assert model.batches == [["a", "b", "c"]]


def test_the_window_bounds_the_wait_for_requests_on_their_way() -> None:
    model = GatedModel()

    async def main() -> Any:
        batcher, _ = make(model, max_queue_delay_s=0.01)
        batcher.start()
        with batcher.arriving():  # a request that never arrives
            result = await answer(batcher, "x")
        await batcher.close(5)
        return result

    assert run(main()) == "out-x"
    assert model.batches == [["x"]]


def test_full_queue_is_refused_immediately() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, recorder, first = await held_batcher(model, max_queue_size=2)
        queued = [asyncio.ensure_future(answer(batcher, x)) for x in ("b", "c")]
        await until(lambda: len(batcher.queue) == 2)
        with pytest.raises(Overloaded):
            await answer(batcher, "d")
        assert recorder.rejections == {"queue_full": 1}
        model.gate.set()
        assert await asyncio.gather(first, *queued) == ["out-a", "out-b", "out-c"]
        await batcher.close(5)

    run(main())
    assert "d" not in model.seen


def test_request_past_its_deadline_fails_and_is_not_run() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, recorder, first = await held_batcher(model)
        with pytest.raises(DeadlineExceeded, match="deadline of 0.05 s"):
            await answer(batcher, "late", deadline=Deadline.after(0.05))
        assert recorder.rejections["deadline"] == 1
        assert len(batcher.queue) == 0
        with pytest.raises(DeadlineExceeded):  # already expired on arrival
            await answer(batcher, "expired", deadline=Deadline(time.monotonic() - 1, 1.0))
        model.gate.set()
        assert await first == "out-a"
        await batcher.close(5)

    run(main())
    assert model.seen == ["a"]


def test_cancelled_request_is_dropped_before_it_runs() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, recorder, first = await held_batcher(model)
        gone = asyncio.ensure_future(answer(batcher, "gone"))
        kept = asyncio.ensure_future(answer(batcher, "kept"))
        await until(lambda: len(batcher.queue) == 2)
        gone.cancel()  # what the route does when the client disconnects
        await asyncio.gather(gone, return_exceptions=True)
        assert len(batcher.queue) == 1
        assert recorder.rejections == {"cancelled": 1}
        model.gate.set()
        assert await asyncio.gather(first, kept) == ["out-a", "out-kept"]
        await batcher.close(5)

    run(main())
    assert "gone" not in model.seen


def test_a_failing_batch_is_retried_one_by_one() -> None:
    model = GatedModel()

    async def main() -> list[Any]:
        batcher, _ = make(model, max_batch_size=3, max_queue_delay_s=1.0)
        batcher.start()
        results = await asyncio.gather(
            *(answer(batcher, x) for x in ("a", "bad", "c")), return_exceptions=True
        )
        await batcher.close(5)
        return results

    a, bad, c = run(main())
    assert (a, c) == ("out-a", "out-c")
    assert isinstance(bad, ValueError)
    assert model.batches[0] == ["a", "bad", "c"]


def test_wrong_number_of_outputs_is_an_error() -> None:
    async def main() -> None:
        batcher: DynamicBatcher[int, int] = DynamicBatcher(
            lambda xs: [], max_batch_size=2, max_queue_delay_s=0.0, max_queue_size=4
        )
        batcher.start()
        with pytest.raises(RuntimeError, match="0 outputs for 1 inputs"):
            await answer(batcher, 1)
        await batcher.close(5)

    run(main())


def test_close_flushes_the_queue_without_waiting_for_the_window_then_refuses() -> None:
    model = GatedModel()

    async def main() -> None:
        # A window far longer than the test's timeout, and a batch-mate on its way that never comes:
        # only the drain's flush can finish these.
        batcher, recorder = make(model, max_batch_size=64, max_queue_delay_s=600.0)
        batcher.start()
        with batcher.arriving():
            pending = [asyncio.ensure_future(answer(batcher, i)) for i in range(3)]
            await until(lambda: len(batcher.queue) == 3)
            await asyncio.wait_for(batcher.close(timeout=20), 10)
        assert [p.result() for p in pending] == ["out-0", "out-1", "out-2"]
        with pytest.raises(Closed):
            await answer(batcher, 99)
        assert recorder.rejections == {"shutting_down": 1}

    run(main())
    assert model.batches == [[0, 1, 2]]


def test_close_fails_what_could_not_be_drained() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, _, first = await held_batcher(model)
        stuck = asyncio.ensure_future(answer(batcher, "b"))
        await until(lambda: len(batcher.queue) == 1)
        await batcher.close(timeout=0.05)  # "a" is still held: the drain times out
        with pytest.raises(Closed):
            await stuck
        # The request whose batch was still running is answered too, not left to its deadline.
        with pytest.raises(Closed):
            await asyncio.wait_for(first, 5)
        model.gate.set()

    run(main())
    assert "b" not in model.seen


async def two_held_instances(model: GatedModel, items: str) -> tuple[Any, Recorder, list[asyncio.Future]]:
    """A started two-instance batcher (batches of 1) with `items` submitted, once both instances
    hold one behind the model's closed gate."""
    model.gate.clear()
    batcher, recorder = make(model, max_batch_size=1, max_queue_delay_s=0.0, instances=2)
    batcher.start()
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(answer(batcher, item)) for item in items]
    await until(lambda: len(model.batches) == 2)
    return batcher, recorder, tasks


def test_instances_run_batches_concurrently_and_no_more() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, recorder, tasks = await two_held_instances(model, "abc")
        # "a" and "b" are both inside the model, held by the gate; "c" waits for an instance.
        await asyncio.sleep(0.05)
        assert len(model.batches) == 2 and len(batcher.queue) == 1 and batcher.running_batches == 2
        model.gate.set()
        assert await asyncio.gather(*tasks) == ["out-a", "out-b", "out-c"]
        await batcher.close(5)
        assert recorder.batches == [1, 1, 1]

    run(main())


def test_a_burst_is_shared_out_among_the_free_instances() -> None:
    model = GatedModel()

    async def main() -> list[Any]:
        batcher, _ = make(model, max_batch_size=16, max_queue_delay_s=0.0, instances=2)
        batcher.start()
        # All eight are queued before either instance loop runs: both are free, each takes half.
        results = await asyncio.gather(*(answer(batcher, i) for i in range(8)))
        await batcher.close(5)
        return results

    assert run(main()) == [f"out-{i}" for i in range(8)]
    assert sorted(len(b) for b in model.batches) == [4, 4]
    # With one instance the same burst is one batch (the limit is the batch size, not a share).
    model = GatedModel()

    async def single() -> None:
        batcher, _ = make(model, max_batch_size=16, max_queue_delay_s=0.0)
        batcher.start()
        await asyncio.gather(*(answer(batcher, i) for i in range(8)))
        await batcher.close(5)

    run(single())
    assert [len(b) for b in model.batches] == [8]


def test_close_answers_every_running_instance() -> None:
    model = GatedModel()

    async def main() -> None:
        batcher, _, held = await two_held_instances(model, "ab")
        await batcher.close(timeout=0.05)
        for task in held:
            with pytest.raises(Closed):
                await asyncio.wait_for(task, 5)
        assert batcher.running_batches == 0
        model.gate.set()

    run(main())


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        DynamicBatcher(lambda xs: xs, max_batch_size=0, max_queue_delay_s=0.0, max_queue_size=1)
    with pytest.raises(ValueError, match="must be >= 1"):
        DynamicBatcher(lambda xs: xs, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=1, instances=0)
