"""The engine process: every model, its versions, batcher and sessions, for every front-end.

It runs the lifecycle (`ServiceState`: none, poll or explicit model control) as a server of one
process does, without a socket of the outside world. Front-end processes connect to its Unix
socket; each sends prepared rows (`Job`s whose arrays lie in the front-end's shared-memory arena)
and gets back each row's answer, its outputs where asked (in this process's arena for that
front-end), and its timings, or its refusal. Rows of every front-end meet in one batcher per model,
so they batch together, and each model's weights are loaded once per server.

What a front-end serves is this process's lifecycle, sent as a `Snapshot` whenever it changes
(checked every `PUSH_S`) and at once after a repository call, which is answered only once every
front-end has taken the change in: a load or unload is then seen on every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import logging
import os
import signal
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from contract.errors import RequestError, UserError
from service.access.keys import LocalRates
from service.engine.request_context import Deadline
from service.engine.rows import Job
from service.engine.runtime import RuntimeFacts
from service.lifecycle.mirror import Batching, Served, Snapshot
from service.lifecycle.state import ServiceState
from service.processes.topology import Topology, private_folder
from service.processes.wire import Arena, Mapped, frame, read_frame, refusal
from service.tasks.pipeline import Pipeline

log = logging.getLogger(__name__)

PUSH_S = 0.1  # how often the lifecycle is compared with what the front-ends were last sent
ACK_S = 5.0  # how long a repository call waits for the front-ends to take its change in
ARENA_BYTES = 16 << 20  # each front-end's share of this process's shared memory (answers' outputs)


@dataclass(eq=False)
class Front:
    """One connected front-end: its arena mapped, this process's arena for it, its running rows."""

    index: int
    writer: asyncio.StreamWriter
    rows: Mapped
    answers: Arena
    running: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    acked: int = -1
    took: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, message: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame(message))


class EngineHost:
    """Serves `state`'s models to the front-ends of `topology` (module docstring)."""

    def __init__(self, state: ServiceState, topology: Topology) -> None:
        self.state = state
        self.topology = topology
        self.fronts: set[Front] = set()
        self.serial = 0
        self.sent: Snapshot | None = None
        self._loads = itertools.count(1)
        self._described: weakref.WeakKeyDictionary[Pipeline, Served] = weakref.WeakKeyDictionary()
        self._server: asyncio.Server | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._bound = 0  # the inode of the socket listened on
        self._calls: set[asyncio.Task[None]] = set()
        self.rates = LocalRates()  # the API keys' buckets of every front-end

    async def start(self) -> None:
        await self._listen()
        self._pusher = asyncio.create_task(self._push_changes(), name="push-lifecycle")

    async def _listen(self) -> None:
        """Listen on the engine's socket, in the server's private folder (made again where a /tmp
        cleaner removed it); an earlier engine's socket there is replaced."""
        path = self.topology.engine_socket
        private_folder(path.parent)
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = await asyncio.start_unix_server(self._connected, path=str(path))
        os.chmod(path, 0o600)
        self._bound = path.stat().st_ino

    async def close(self) -> None:
        if self._pusher is not None:
            self._pusher.cancel()
        if self._server is not None:
            self._server.close()
        for front in list(self.fronts):
            front.writer.close()

    def describe(self, model: Pipeline) -> Served:
        """What a front-end needs to serve `model`; worked out once per load (its `ready` changes)."""
        known = self._described.get(model)
        if known is None:
            batcher = model.batcher
            batching = Batching(
                batcher.max_batch_size,
                batcher.max_queue_delay_s,
                batcher.max_queue_size,
                batcher.always_wait,
                batcher.instances,
            )
            known = Served(
                next(self._loads),
                model.task,
                model.spec,
                model.version,
                model.variant,
                RuntimeFacts.of(model.session),
                batching,
                model.ready,
            )
            self._described[model] = known
        if known.ready != model.ready:
            known = self._described[model] = replace(known, ready=model.ready)
        return known

    def push(self) -> int:
        """Send the lifecycle to every front-end where it changed; the serial they will ack."""
        snapshot = self.state.snapshot(self.describe)
        if snapshot != self.sent:
            self.serial += 1
            self.sent = snapshot
            for front in self.fronts:
                front.send(("snapshot", self.serial, snapshot))
        return self.serial

    async def _push_changes(self) -> None:
        """Push the lifecycle where it changed, and listen again where the socket was removed
        (the connected front-ends keep their connections; a new one needs the path)."""
        while True:
            await asyncio.sleep(PUSH_S)
            self.push()
            try:
                gone = self.topology.engine_socket.stat().st_ino != self._bound
            except OSError:
                gone = True
            if gone:
                log.warning("the engine's socket was removed: listening again")
                try:
                    await self._listen()
                except (OSError, UserError) as exc:
                    log.error("the engine cannot listen again: %s", exc)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # The token first, as it is: nothing is unpickled from a peer that has not shown it.
            token = await asyncio.wait_for(reader.readexactly(len(self.topology.token)), ACK_S)
            if not hmac.compare_digest(token, self.topology.token):
                log.error("a connection to the engine's socket without the server's token: closed")
                writer.close()
                return
            kind, index, arena = await asyncio.wait_for(read_frame(reader), ACK_S)
        except (OSError, EOFError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            writer.close()
            return
        try:
            front = Front(
                index, writer, Mapped(arena), Arena(self.topology.arena("engine", index), ARENA_BYTES)
            )
        except OSError as exc:
            log.error("front-end %d: its shared memory cannot be mapped: %s", index, exc)
            writer.close()
            return
        front.send(("welcome", front.answers.name))
        front.send(("snapshot", self.serial, self.sent or self.state.snapshot(self.describe)))
        self.fronts.add(front)
        log.info("front-end %d connected", index)
        try:
            while True:
                self._take(front, await read_frame(reader))
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass
        finally:
            self.fronts.discard(front)
            front.took.set()  # a repository call waiting for its ack waits for it no more
            for task in front.running.values():
                task.cancel()
            await asyncio.gather(*front.running.values(), return_exceptions=True)
            front.answers.close()
            front.rows.close()
            writer.close()
            log.info("front-end %d disconnected", index)

    def _take(self, front: Front, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "job":
            job_id = message[1]
            row = front.running[job_id] = asyncio.create_task(self._row(front, *message[1:]))
            row.add_done_callback(functools.partial(self._ended, front, job_id))
        elif kind == "cancel":
            if (task := front.running.get(message[1])) is not None:
                task.cancel()
        elif kind == "release":
            front.answers.release(message[1])
        elif kind == "ack":
            front.acked = max(front.acked, message[1])
            front.took.set()
        elif kind == "take":  # a token of an API key's bucket: the server's one
            front.send(("reply", message[1], self.rates.take_now(*message[2:])))
        elif kind == "call":
            call = asyncio.create_task(self._call(front, *message[1:]))
            self._calls.add(call)  # held until done: the loop keeps only a weak reference
            call.add_done_callback(self._calls.discard)

    async def _row(
        self,
        front: Front,
        job_id: int,
        name: str,
        version: int,
        tensors: dict[str, Any],
        answer: Any,
        observed: bool,
        reads: frozenset[str] | None,
        at: float,
        timeout_s: float,
    ) -> None:
        """One row through its model's batcher; exactly one final message, so that the front-end
        knows when its arena's block is free again."""
        try:
            job = Job(front.rows.view(tensors), answer, observed, reads)
            with self.state.lease(name, version, kind=Pipeline) as model:
                batched = await model.batcher.submit(job, Deadline(at, timeout_s))
            done = batched.output
            outputs = {k: v for k, v in done.outputs.items() if reads is None or k in reads}
            placed = front.answers.place(outputs)
            front.send(("done", job_id, placed, done.answer, done.finished, batched.queue_s, batched.run_s))
        except asyncio.CancelledError:
            front.send(("dropped", job_id))
        except RequestError as exc:
            front.send(("refused", job_id, refusal(exc)))
        except Exception as exc:
            log.exception("model %s version %s: a row failed", name, version)
            front.send(("refused", job_id, refusal(exc)))

    @staticmethod
    def _ended(front: Front, job_id: int, row: asyncio.Task[None]) -> None:
        """A row's task is over; one cancelled before it ran (its cancel read with its job) never
        sent its final word, which is sent here."""
        front.running.pop(job_id, None)
        if row.cancelled():
            front.send(("dropped", job_id))

    async def _taken(self, serial: int) -> None:
        """Wait (at most `ACK_S`) until every connected front-end has acked lifecycle `serial`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ACK_S):
                while waiting := [f for f in self.fronts if f.acked < serial]:
                    for f in waiting:
                        f.took.clear()
                    acks = [asyncio.create_task(f.took.wait()) for f in waiting]
                    try:
                        await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for ack in acks:
                            ack.cancel()

    async def _call(self, front: Front, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        """A repository call (load, unload) made on one front-end: answered once every front-end
        has the lifecycle it left."""
        try:
            if method == "load_model":
                await self.state.load_model(*args)
            elif method == "unload_model":
                await self.state.unload_model(*args)
            else:
                raise ValueError(f"unknown call {method!r}")
            result = None
        except Exception as exc:
            if not isinstance(exc, RequestError):
                log.exception("the repository call %s failed", method)
            result = refusal(exc)
        await self._taken(self.push())
        front.send(("reply", call_id, result))


async def run_engine(state: ServiceState, topology: Topology, report: Any) -> None:
    """The engine process's life: serve the front-ends, load the models, report to the supervisor
    (`report`, the process link's coroutine) once they are loaded, and on SIGTERM or SIGINT drain
    and close every model."""
    host = EngineHost(state, topology)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: None)  # keys and TLS are the front-ends'
    await host.start()
    loader = asyncio.create_task(state.load(), name="load-models")
    reporter: asyncio.Task[None] | None = None
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([loader, stopping], return_when=asyncio.FIRST_COMPLETED)
    if loader.done():
        host.push()
        reporter = asyncio.create_task(report(), name="engine-report")
        await stopping
    loader.cancel()
    if reporter is not None:
        reporter.cancel()
    await state.shutdown()
    host.push()
    await host.close()
