"""The request being served: its deadline, its id, where its time went and its trace, for every
layer to read; and its heavy answer moved off the event loop.

A request's `Deadline` is one value from arrival to answer (read, decode, queue, run): it carries
both the instant (for waiting) and the configured timeout (for the message the client gets), so no
layer passes the two separately.

A transport opens a `RequestContext` when a request arrives (`open_request`) and closes it when
the answer has gone; everything the request causes on the way runs in its task (or in threads and
tasks that copy its context), so `current()` finds it without any layer passing it on. The log
formatter reads the id, route, model and trace from it; the tracing code keeps the request's server
span and tracer here, `None` when tracing is off. What a batch tells its rows (`Batched`) and its
observers (`BatchRun`) is defined here too, and where a request's time went in the batcher
(`Timings`), which travels back with its answer (`Timed`) to the route that writes it as
`Server-Timing`, not through this context.

Request ids come from the client (`X-Request-ID`, REST; `x-request-id` metadata, gRPC) when they
are short and plain (`REQUEST_ID_PATTERN`), so that they can be logged and echoed without
escaping; anything else is replaced by a generated id, never echoed.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from contract.errors import DeadlineExceeded, ErrorCode

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_LENGTH = 128
# Letters, digits and the punctuation of UUIDs, ULIDs and the ids proxies generate; no spaces,
# quotes or control characters, so an id is safe in a header, a log line and a JSON string.
REQUEST_ID_PATTERN = re.compile(rf"[A-Za-z0-9._:@+=/-]{{1,{MAX_REQUEST_ID_LENGTH}}}")


def accepted_request_id(given: str | bytes | None) -> str:
    """The client's id when it is acceptable, else a newly generated one (32 hex digits)."""
    if isinstance(given, bytes):
        given = given.decode("latin-1")
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    # An identifier, not a secret: the process's Mersenne Twister (reseeded in forked workers) costs
    # no system call, where uuid4 reads the kernel's random source on every request.
    return f"{random.getrandbits(128):032x}"


@dataclass(eq=False)
class RequestContext:
    """One request's identity and timings; `span`/`tracer` are OpenTelemetry objects or None."""

    request_id: str
    transport: str  # http or grpc
    method: str = ""
    route: str = ""
    model: str | None = None
    started: float = 0.0  # time.perf_counter() at arrival
    error_code: str | None = None
    error_message: str | None = None
    span: Any = None
    tracer: Any = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


_current: ContextVar[RequestContext | None] = ContextVar("gmlp_request", default=None)
current = _current.get  # the request being served in this task or thread, if any


O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True)
class Batched(Generic[O]):
    """A request's result from its batch, with where its time went: `queue_s` from enqueue to the
    batch's start, `run_s` the model run of the batch that answered it (what Server-Timing says)."""

    output: O
    queue_s: float
    run_s: float

    @property
    def timings(self) -> Timings:
        return Timings(self.queue_s, self.run_s)


@dataclass(frozen=True)
class Timings:
    """Where a request's time went in its model's batcher: the longest queue wait and the longest
    batch run among its rows (they run side by side, so the longest are the request's)."""

    queue_s: float = 0.0
    infer_s: float = 0.0

    @classmethod
    def longest(cls, rows: Iterable[Timings]) -> Timings:
        queue_s = infer_s = 0.0
        for row in rows:
            queue_s, infer_s = max(queue_s, row.queue_s), max(infer_s, row.infer_s)
        return cls(queue_s, infer_s)


@dataclass(frozen=True)
class Timed(Generic[O]):
    """A task's answer and its `Timings`, as the task returns them to the transport."""

    value: O
    timings: Timings


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


@contextmanager
def open_request(context: RequestContext) -> Iterator[RequestContext]:
    """Make `context` the current request for the duration of the block."""
    context.started = context.started or time.perf_counter()
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def note_model(name: str) -> None:
    """The model the current request was resolved to (for its log lines and spans)."""
    if (context := current()) is not None:
        context.model = name


def note_error(code: str, message: str) -> None:
    """The machine code of the error the current request is answered with."""
    if (context := current()) is not None:
        context.error_code, context.error_message = code, message


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


# Encoding a large answer (JSON of millions of numbers, or tens of megabytes of raw tensors) takes
# tens to hundreds of milliseconds of CPU; on the event loop that is a pause for every other request
# and probe of the process (`/health/live` included). Small answers, the common case, are encoded in
# place: a thread hand-off costs more than they do.
# Answers up to this many bytes (an upper bound of their encoded size) are encoded on the loop:
# about a millisecond of JSON encoding at most.
INLINE_ENCODE_BYTES = 64 * 1024


async def encode_off_loop(encode: Callable[[], T], size: int) -> T:
    """`encode()`, in a worker thread when `size` (its output's bound in bytes) is over
    `INLINE_ENCODE_BYTES`, else in place."""
    if size <= INLINE_ENCODE_BYTES:
        return encode()
    return await asyncio.to_thread(encode)
