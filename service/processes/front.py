"""A front-end process's side of the engine: its copy of the lifecycle and the link its rows take.

A front-end runs the whole HTTP and gRPC service (parsing, access, decoding, preprocessing,
answers) over `FrontState`: the engine's lifecycle as the engine last sent it (`restore`), each
loaded model built here without a session (`Pipeline` over the engine's `RuntimeFacts`), its rows
handed to the engine by `EngineQueue`. Repository calls go to the engine, which answers once every
front-end has the change.

While the engine is away (it died and the supervisor is starting it again), requests are refused
with 503 not_ready and Retry-After, and rows already sent fail the same way: none waits for an
engine that is gone, and none is answered twice. The link connects again every `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from contract.errors import ErrorCode, NotReady, UserError
from service.access.keys import LocalRates
from service.engine.request_context import Batched, Deadline
from service.engine.rows import Done, Job
from service.lifecycle.mirror import Served, Snapshot
from service.lifecycle.state import Phase, ServiceState
from service.processes.topology import Topology
from service.processes.wire import Arena, Mapped, Tensors, frame, read_frame, refused
from service.settings import ServiceSettings
from service.tasks.pipeline import Pipeline
from service.tasks.registry import PIPELINES
from service.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)

RETRY_S = 0.2
ARENA_BYTES = 16 << 20  # this front-end's shared memory for its rows' inputs
ENGINE_GONE = "the engine process is restarting"
PARENT_CHECK_S = 0.5  # how often a front-end that waits for the engine's models looks for its parent
RATE_S = 0.5  # how long a key's token is asked of the engine before this front-end decides alone


@dataclass(eq=False)
class _Sent:
    future: asyncio.Future[Batched[Done]]
    tensors: Tensors  # the row's inputs in this process's arena, freed at the engine's final word


class EngineLink:
    """The connection to the engine: rows out and answers back, calls, and the lifecycle."""

    def __init__(self, topology: Topology, state: FrontState) -> None:
        self.topology = topology
        self.state = state
        self.arena = Arena(topology.arena("front-end", topology.index), ARENA_BYTES)
        self._ids = itertools.count()
        self._sent: dict[int, _Sent] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._answers: Mapped | None = None
        self._built: dict[int, Pipeline] = {}  # by load
        self.own_rates = LocalRates()

    @property
    def waiting(self) -> int:
        """Rows sent whose final word has not come back: their blocks of the arena are held."""
        return len(self._sent)

    async def run(self) -> None:
        """Stay connected to the engine until cancelled."""
        try:
            while True:
                with contextlib.suppress(OSError, EOFError, asyncio.IncompleteReadError):
                    await self._connected()
                self._lost()
                await asyncio.sleep(RETRY_S)
        finally:
            self._lost()
            self.arena.close()

    async def _connected(self) -> None:
        reader, writer = await asyncio.open_unix_connection(str(self.topology.engine_socket))
        try:
            writer.write(self.topology.token + frame(("hello", self.topology.index, self.arena.name)))
            kind, answers = await read_frame(reader)
            self._answers, self._writer = Mapped(answers), writer
            log.info("%s: connected to the engine", self.topology.name)
            while True:
                await self._take(await read_frame(reader))
        finally:
            writer.close()

    def _lost(self) -> None:
        """The engine is gone: every row and call still waiting fails (503), the service is not
        ready until the engine's next lifecycle arrives."""
        if self._writer is not None:
            log.warning("%s: the engine connection is lost", self.topology.name)
        self._writer = None
        self.state.engine_lost()
        for sent in self._sent.values():
            if not sent.future.done():
                sent.future.set_exception(NotReady(ErrorCode.NOT_READY, ENGINE_GONE))
            self.arena.release(sent.tensors)
        self._sent.clear()
        for call in self._calls.values():
            if not call.done():
                call.set_exception(NotReady(ErrorCode.NOT_READY, ENGINE_GONE))
        self._calls.clear()
        if self._answers is not None:
            self._answers.close()
            self._answers = None

    async def _take(self, message: tuple[Any, ...]) -> None:
        kind, key = message[0], message[1]
        if kind == "snapshot":
            await self._restore(message[2])
            self._send(("ack", key))
        elif kind == "reply":
            if (call := self._calls.pop(key, None)) is not None and not call.done():
                call.set_result(message[2])
        elif (sent := self._sent.pop(key, None)) is not None:
            self.arena.release(sent.tensors)  # the engine's final word on the row: its block is free
            if kind == "done":
                _, _, placed, answer, finished, queue_s, run_s = message
                assert self._answers is not None
                outputs = self._answers.copy(placed)
                if placed:
                    self._send(("release", placed))
                if not sent.future.done():
                    sent.future.set_result(Batched(Done(outputs, answer, finished), queue_s, run_s))
            elif kind == "refused" and not sent.future.done():
                sent.future.set_exception(refused(message[2]))

    async def _restore(self, snapshot: Snapshot) -> None:
        """Take the engine's lifecycle in: the models of new loads built first (files read, off
        the event loop), then the table replaced at once."""
        loaded = snapshot.served()
        fresh = [s for s in loaded if s.load not in self._built]
        built = await asyncio.to_thread(lambda: [self._build(served) for served in fresh])
        kept = {s.load for s in loaded}
        self._built = {load: model for load, model in self._built.items() if load in kept}
        self._built |= {s.load: model for s, model in zip(fresh, built, strict=True) if model is not None}

        def known(served: Served) -> Pipeline | None:
            model = self._built.get(served.load)
            if model is not None:
                model.ready = served.ready
            return model

        self.state.restore(snapshot, known)

    def _build(self, served: Served) -> Pipeline | None:
        try:
            kind = PIPELINES[served.task]
            model = kind(served.spec, self.state.settings, served.version, served.variant, served.runtime)
        except Exception:
            log.exception("%s: model %s cannot be prepared here", self.topology.name, served.spec.name)
            return None
        model.batcher = EngineQueue(self, served.spec.name, int(served.version), **served.batching.__dict__)
        return model

    def _send(self, message: Any) -> None:
        if self._writer is None or self._writer.is_closing():
            raise NotReady(ErrorCode.NOT_READY, ENGINE_GONE)
        self._writer.write(frame(message))

    async def submit(self, name: str, version: int, job: Job, deadline: Deadline | None) -> Batched[Done]:
        """One row to the engine and its result back (cancelled: the engine drops it too)."""
        deadline = deadline or Deadline.after(self.state.settings.request_timeout_s)
        job_id = next(self._ids)
        tensors = self.arena.place(job.feeds)
        future: asyncio.Future[Batched[Done]] = asyncio.get_running_loop().create_future()
        try:
            self._send(("job", job_id, name, version, tensors, job.answer, job.observed, job.reads,
                        deadline.at, deadline.timeout_s))  # fmt: skip
        except NotReady:
            self.arena.release(tensors)
            raise
        self._sent[job_id] = _Sent(future, tensors)
        try:
            # The engine keeps the deadline too; this one holds where the engine hangs.
            async with asyncio.timeout(max(0.0, deadline.remaining())):
                return await future
        except TimeoutError:
            self._cancel(job_id)
            raise deadline.exceeded() from None
        except asyncio.CancelledError:
            self._cancel(job_id)
            raise

    def _cancel(self, job_id: int) -> None:
        """Tell the engine a row's request gave up; its block is freed at the engine's final word."""
        with contextlib.suppress(NotReady):
            self._send(("cancel", job_id))

    async def call(self, method: str, *args: Any) -> None:
        """A repository call, made by the engine; its refusal raised here."""
        result = await self._ask("call", method, args)
        if result is not None:
            raise refused(result)

    async def take(self, name: str, rate: float, burst: int) -> float:
        """A token of key `name`'s bucket, which the engine holds for the server (`Rates`); this
        front-end's own bucket while the engine is away or does not answer within `RATE_S`."""
        try:
            async with asyncio.timeout(RATE_S):
                wait: float = await self._ask("take", name, rate, burst)
                return wait
        except (NotReady, TimeoutError):
            return self.own_rates.take_now(name, rate, burst)

    async def _ask(self, kind: str, *args: Any) -> Any:
        """The engine's reply to a message of `kind`."""
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._send((kind, call_id, *args))
        self._calls[call_id] = future
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)


@dataclass(eq=False)
class EngineQueue:
    """A front-end model's `RowQueue`: its rows go to the engine's batcher for the model."""

    link: EngineLink
    name: str
    version: int
    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    always_wait: bool
    instances: int

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        yield  # the engine batches what reaches it; a row on its way here is not waited for

    async def submit(self, item: Job, deadline: Deadline | None = None) -> Batched[Done]:
        return await self.link.submit(self.name, self.version, item, deadline)

    def start(self) -> None:
        pass

    async def close(self, timeout: float | None = None) -> None:
        pass


class FrontState(ServiceState):
    """The lifecycle as a front-end serves it: the engine's, restored from what the engine sends;
    loads and unloads are the engine's to make."""

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics, topology: Topology) -> None:
        super().__init__(settings, metrics)
        self.link = EngineLink(topology, self)
        self.lost = False
        self._settled = asyncio.Event()
        self._linking: asyncio.Task[None] | None = None

    async def load(self) -> None:
        """Connect to the engine and wait until its models are loaded (or failed to). A supervisor
        that ends meanwhile takes its engine with it, and the signal it leaves this process comes
        while uvicorn still waits for this start, which it does not interrupt: so the wait also
        ends (UserError) once this process's parent is another, as the kernel makes it then."""
        parent = os.getppid()
        self._linking = asyncio.create_task(self.link.run(), name="engine-link")
        while not self._settled.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), PARENT_CHECK_S)
            if os.getppid() != parent:
                raise UserError(f"{self.link.topology.name}: the supervisor is gone before the models loaded")

    def restore(self, snapshot: Snapshot, built: Callable[[Served], Pipeline | None]) -> None:
        super().restore(snapshot, built)
        self.lost = False
        if self.phase in (Phase.READY, Phase.FAILED):
            self._settled.set()

    def engine_lost(self) -> None:
        self.lost = True
        if self.phase is Phase.READY:
            self.phase = Phase.LOADING

    def not_ready_error(self) -> NotReady:
        if self.lost and self.phase is not Phase.DRAINING:
            return NotReady(ErrorCode.NOT_READY, ENGINE_GONE)
        return super().not_ready_error()

    async def load_model(self, name: str, config: str | None = None) -> None:
        await self.link.call("load_model", name, config)

    async def unload_model(self, name: str) -> None:
        await self.link.call("unload_model", name)

    async def shutdown(self) -> None:
        self.phase = Phase.DRAINING
        if self._linking is not None:
            self._linking.cancel()
            await asyncio.gather(self._linking, return_exceptions=True)
