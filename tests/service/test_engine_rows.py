"""An engine host and a front-end's lifecycle in one event loop, over the real socket, shared
memory and tiny classifier: what the two say of a row at the edges of its life, and of a key's
rate."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

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
    host: EngineHost
    front: FrontState

    @property
    def served(self) -> VisionPipeline:
        model = self.front.loaded(MODEL)
        assert isinstance(model, VisionPipeline) and isinstance(model.batcher, EngineQueue)
        return model


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
    engine = ServiceState(settings, ServiceMetrics(settings.max_batch_size))
    host = EngineHost(engine, topology)
    await host.start()
    await engine.load()
    front = FrontState(settings, ServiceMetrics(settings.max_batch_size), topology.as_front(0))
    try:
        await asyncio.wait_for(front.load(), 20)
        yield Pair(engine, host, front)
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
    return make_settings(model_repository=repository)


def test_a_row_cancelled_as_it_is_sent_gets_its_final_word(
    settings: ServiceSettings, folder: Path, cifar_images: list[bytes]
) -> None:
    """A request that gives up right after sending its row: the engine may read the cancel with
    the job, before the row's task ever ran; the front-end still hears that the row is over (its
    arena block freed)."""

    async def scenario() -> None:
        async with engine_and_front(settings, folder) as pair:
            for image in cifar_images[:40]:
                row = asyncio.create_task(pair.served.submit_image(image, Deadline.after(30), None))
                await asyncio.sleep(0)  # the row is sent
                row.cancel()
            await until(lambda: pair.front.link.waiting == 0)

    asyncio.run(scenario())


def test_a_keys_bucket_is_the_engines_and_the_front_end_decides_alone_while_it_is_away(
    settings: ServiceSettings, folder: Path
) -> None:
    async def scenario() -> None:
        async with engine_and_front(settings, folder) as pair:
            link = pair.front.link
            takes = [await link.take("k", 1e-6, 2) for _ in range(3)]
            assert takes[:2] == [0.0, 0.0] and takes[2] > 0
            assert pair.host.rates.buckets[("k", 1e-6, 2)].tokens < 1  # taken from the engine's
            assert not link.own_rates.buckets
            await pair.front.shutdown()  # the engine gone: this front-end's own bucket, full
            assert await link.take("k", 1e-6, 2) == 0.0

    asyncio.run(scenario())
