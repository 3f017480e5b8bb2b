"""A front-end's requests being decoded count for the engine's batcher, as in one process.

An engine host and a front-end's lifecycle run in this test's event loop over the real socket,
shared memory and tiny classifier: the batcher then waits for a row still being decoded in the
front-end (with the `arriving` policy a batch waits only for those), and every count told is
taken back, whether the request sends its row, fails on the way or the front-end goes.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.engine.batcher import DynamicBatcher
from service.engine.request_context import Deadline
from service.lifecycle.state import ServiceState
from service.processes.engine import EngineHost
from service.processes.front import EngineQueue, FrontState
from service.processes.topology import Role, Topology
from service.settings import ServiceSettings
from service.tasks.vision import VisionPipeline
from service.telemetry.metrics import ServiceMetrics

MODEL = "tiny-vision"


@dataclass
class Pair:
    engine: ServiceState
    front: FrontState
    engine_metrics: ServiceMetrics

    @property
    def batcher(self) -> DynamicBatcher:
        batcher = self.engine.loaded(MODEL).batcher
        assert isinstance(batcher, DynamicBatcher)
        return batcher

    @property
    def served(self) -> VisionPipeline:
        model = self.front.loaded(MODEL)
        assert isinstance(model, VisionPipeline) and isinstance(model.batcher, EngineQueue)
        return model

    def batches(self) -> tuple[float, float]:
        """Batches run so far, and their rows."""
        sample = self.engine_metrics.registry.get_sample_value
        labels = {"model": MODEL}
        return sample("gmlp_batch_size_count", labels) or 0.0, sample("gmlp_batch_size_sum", labels) or 0.0


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met within 5 s")


@asynccontextmanager
async def engine_and_front(settings: ServiceSettings, folder: Path) -> AsyncIterator[Pair]:
    """An engine host over `settings`' models and one front-end's lifecycle linked to it; `folder`
    is the server's private folder (0700)."""
    topology = Topology(Role.ENGINE, 0, 1, folder, secrets.token_bytes(32), 2, f"gmlp-{secrets.token_hex(6)}")
    metrics = ServiceMetrics(settings.max_batch_size)
    engine = ServiceState(settings, metrics)
    host = EngineHost(engine, topology)
    await host.start()
    await engine.load()
    front = FrontState(settings, ServiceMetrics(settings.max_batch_size), topology.as_front(0))
    try:
        await asyncio.wait_for(front.load(), 20)
        yield Pair(engine, front, metrics)
    finally:
        await front.shutdown()
        await host.close()
        await engine.shutdown()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The server's private folder."""
    tmp_path.chmod(0o700)
    return tmp_path


@pytest.fixture
def settings(make_settings: Callable[..., ServiceSettings], repository: Path) -> ServiceSettings:
    # A window far longer than a row's trip: a batch that waits, waits for the row told of; one
    # instance, so that two rows queued together run as one batch.
    return make_settings(model_repository=repository, max_queue_delay_ms=3000.0, instances=1)


def test_a_batch_waits_for_a_row_still_decoded_in_a_front_end(
    settings: ServiceSettings, folder: Path, cifar_images: list[bytes]
) -> None:
    async def scenario() -> None:
        async with engine_and_front(settings, folder) as pair:
            queue = pair.served.batcher
            deadline = Deadline.after(30)
            slow = asyncio.Event()

            async def decoded_slowly() -> object:
                with queue.arriving():
                    await slow.wait()  # the request's decoding, still under way
                return await pair.served.submit_image(cifar_images[0], deadline, None)

            held = asyncio.create_task(decoded_slowly())
            await asyncio.sleep(0)  # inside `arriving`
            other = asyncio.create_task(pair.served.submit_image(cifar_images[1], deadline, None))
            # The other row tells the engine of the one on its way, and waits for it.
            await until(lambda: len(pair.batcher.queue) == 1 and pair.batcher.arriving_now == 1)
            assert pair.batches() == (0.0, 0.0)
            slow.set()
            await asyncio.gather(held, other)
            assert pair.batches() == (1.0, 2.0)  # one batch of both rows
            assert pair.batcher.arriving_now == 0

    asyncio.run(scenario())


def test_every_count_told_is_taken_back(
    settings: ServiceSettings, folder: Path, cifar_images: list[bytes]
) -> None:
    """Requests told of that fail on their way, or leave without a row, or whose front-end goes:
    the engine hears of it, and the row that waited for them runs."""

    async def scenario() -> None:
        async with engine_and_front(settings, folder) as pair:
            queue = pair.served.batcher
            deadline = Deadline.after(30)
            go = asyncio.Event()

            async def fails() -> None:
                with queue.arriving():
                    await go.wait()
                    raise ValueError("not an image")

            async def leaves() -> None:
                with queue.arriving():
                    await go.wait()

            on_their_way = [asyncio.create_task(fails()), asyncio.create_task(leaves())]
            await asyncio.sleep(0)
            row = asyncio.create_task(pair.served.submit_image(cifar_images[0], deadline, None))
            await until(lambda: len(pair.batcher.queue) == 1 and pair.batcher.arriving_now == 2)
            go.set()
            await asyncio.gather(*on_their_way, return_exceptions=True)
            await row  # no longer waits for the two that will not come
            assert pair.batcher.arriving_now == 0
            assert pair.batches() == (1.0, 1.0)

            # A front-end that goes while its requests are decoded: the engine forgets them.
            go.clear()
            waiting = asyncio.create_task(leaves())
            await asyncio.sleep(0)
            lost = asyncio.create_task(pair.served.submit_image(cifar_images[1], deadline, None))
            await until(lambda: pair.batcher.arriving_now == 1)
            await pair.front.shutdown()  # its connection closed, as a dead process's is
            await until(lambda: pair.batcher.arriving_now == 0)
            go.set()
            await asyncio.gather(waiting, lost, return_exceptions=True)

    asyncio.run(scenario())


def test_a_row_cancelled_as_it_is_sent_gets_its_final_word(
    settings: ServiceSettings, folder: Path, cifar_images: list[bytes]
) -> None:
    """A request that gives up right after sending its row: the engine may read the cancel with
    the job, before the row's task ever ran; the front-end still hears that the row is over (its
    arena block freed) and the engine forgets that the request was on its way."""

    async def scenario() -> None:
        async with engine_and_front(settings, folder) as pair:
            for image in cifar_images[:40]:
                row = asyncio.create_task(pair.served.submit_image(image, Deadline.after(30), None))
                await asyncio.sleep(0)  # the row is sent
                row.cancel()
            await until(lambda: pair.front.link.waiting == 0)
            await until(lambda: pair.batcher.arriving_now == 0)

    asyncio.run(scenario())
