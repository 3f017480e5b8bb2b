"""The load engine of the measuring programs: closed and open loop over HTTP/1.1 keep-alive
connections on asyncio, every answer checked.

`gmlp loadtest` drives locust, whose processes take seconds to start: right for a sweep a person
reads, too slow for a tuner that measures dozens of short windows, and too heavy per request for
a soak that must offer twice what the server sustains on the same machine. `gmlp tune`, the soak
and swap benchmarks and the Swarm probe load with `run_closed_loop` (N connections, each sending
as soon as its last answer came) and `open_loop` (arrivals at a fixed rate whatever the server
answers). Each request is a `PreparedRequest` (encoded once, with the check of its answer; the
locustfile sends the same requests and judges answers with the same `answer_error`). Standard
library only: `gmlp tune` runs it wherever the serving install does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from contract.errors import UserError
from contract.formats import MLM_TASK, VISION_TASK
from loadtests.checks import check_classify, check_fill_mask
from loadtests.workload import LoadConfig, fitting, jpeg_body, load_images, load_sentences

log = logging.getLogger(__name__)

# A request that has not answered within this is a failure (and its connection is dropped).
REQUEST_TIMEOUT_S = 30.0
# An idle connection is dropped after this, well before uvicorn's keep-alive timeout (5 s): reusing
# one the server is closing at that moment would fail a request for the client's reason.
IDLE_S = 2.0


@dataclass(frozen=True)
class PreparedRequest:
    """One POST, encoded once: its path with query, body, content type, extra headers and the
    answer's check (None when the answer is right, else what is wrong)."""

    path: str
    body: bytes
    content_type: str
    check: Callable[[Any], str | None]
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """One request sent: when (perf_counter), how long it took, its status (0: no answer) and
    what was wrong with it (None: a good answer)."""

    started: float
    seconds: float
    path: str
    status: int
    error: str | None


def percentile(values: Sequence[float], q: float, digits: int | None = None) -> float | None:
    """The q-th percentile (0-100) of `values`, nearest rank, rounded to `digits` if given; None
    without any."""
    if not values:
        return None
    ordered = sorted(values)
    value = ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]
    return value if digits is None else round(value, digits)


@dataclass
class LoadResult:
    """What one window measured: the outcomes of the requests sent inside it (after the warm-up)."""

    concurrency: int
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    answered: int = 0  # every request that finished, the warm-up's included (for CPU per request)
    late: int = 0  # open loop: arrivals the client could not send on time
    skipped: int = 0  # open loop: arrivals past the bound of open requests
    drain_s: float = 0.0  # open loop: from the last arrival until the last answer

    @property
    def latencies_ms(self) -> list[float]:
        return [1000 * o.seconds for o in self.outcomes if o.error is None]

    @property
    def failures(self) -> Counter[str]:
        return Counter(o.error for o in self.outcomes if o.error is not None)

    @property
    def ok(self) -> int:
        return sum(1 for o in self.outcomes if o.error is None)

    @property
    def failed(self) -> int:
        return len(self.outcomes) - self.ok

    @property
    def rps(self) -> float:
        """Good answers per second over the measured window."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float | None:
        return percentile(self.latencies_ms, q)

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "seconds": round(self.seconds, 3),
            "requests": self.ok,
            "failures": self.failed,
            "failure_reasons": dict(self.failures.most_common(5)),
            "rps": round(self.rps, 2),
            "p50_ms": percentile(self.latencies_ms, 50, 3),
            "p99_ms": percentile(self.latencies_ms, 99, 3),
        }


_RAW_BUNDLED = LoadConfig(upload="raw")  # the bundled inputs, each image as the raw body


def task_requests(
    task: str, model: str | None, n_tokens: int | None, config: LoadConfig = _RAW_BUNDLED
) -> list[PreparedRequest]:
    """The requests of `config`'s workload (`loadtests.workload`) for one task, asking for `model`
    (None: the server's default): /classify with each JPEG in each upload form, or /fill-mask with
    each masked sentence that fits a window of `n_tokens` (None: unknown, all of them)."""
    if task == VISION_TASK:
        images, source = load_images(config.cifar_path)
        log.info("classify: %d JPEGs from %s", len(images), source)
        forms = {"multipart": (True,), "raw": (False,), "mixed": (True, False)}[config.upload]
        return [
            classify_request(image, config.top_k, model=model, multipart=multipart)
            for image in images
            for multipart in forms
        ]
    if task == MLM_TASK:
        every, source = load_sentences(config)
        sentences = fitting(every, n_tokens)
        log.info(
            "fill-mask: %d of %d masked sentences from %s fit %s tokens",
            len(sentences),
            len(every),
            source,
            n_tokens,
        )
        if not sentences:
            raise UserError(f"no sentence fits {model or 'the default model'}'s window of {n_tokens} tokens")
        return [fill_mask_request(s.text, config.top_k, model=model) for s in sentences]
    raise UserError(f"model {model} serves {task!r}; the load generator sends {VISION_TASK} and {MLM_TASK}")


def classify_request(
    image: bytes, top_k: int, *, model: str | None = None, multipart: bool = False
) -> PreparedRequest:
    """POST /classify with a JPEG as the raw body or as a multipart upload, checked."""
    query = urlencode({"top_k": top_k} | ({"model": model} if model else {}))
    check = functools.partial(check_classify, top_k=top_k, expected_model=model)
    return PreparedRequest(f"/classify?{query}", *jpeg_body(image, multipart), check)


def fill_mask_request(text: str, top_k: int, *, model: str | None = None) -> PreparedRequest:
    """POST /fill-mask with a JSON body, checked against the text's masks."""
    payload: dict[str, Any] = {"text": text, "top_k": top_k} | ({"model": model} if model else {})
    return PreparedRequest(
        "/fill-mask",
        json.dumps(payload).encode(),
        "application/json",
        lambda answer: check_fill_mask(answer, text, top_k, model),
    )


class _Connection:
    """One keep-alive HTTP/1.1 connection, reopened when the server closes it or it idled."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def post(self, request: PreparedRequest) -> tuple[int, bytes]:
        if self.writer is not None and time.monotonic() - self.used > IDLE_S:
            self.close()
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        extra = "".join(f"{name}: {value}\r\n" for name, value in request.headers)
        head = (
            f"POST {request.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}"
            f"Content-Type: {request.content_type}\r\nContent-Length: {len(request.body)}\r\n\r\n"
        )
        self.writer.write(head.encode("latin-1") + request.body)
        await self.writer.drain()
        status, headers = _parse_head(await self.reader.readuntil(b"\r\n\r\n"))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(self.reader)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        self.used = time.monotonic()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in lines)
    headers = {name.strip().lower(): value.strip() for name, sep, value in fields if sep}
    return int(status_line.split(" ", 2)[1]), headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are sent to us: the closing empty line
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


def answer_error(request: PreparedRequest, status: int, body: bytes) -> str | None:
    """What is wrong with an answer to `request` (None: nothing): a refusal, by its status and the
    service's error code (one failure row per code), a body that is not JSON, or what the
    request's check finds."""
    if status != 200:
        try:
            return f"HTTP {status} {json.loads(body)['error']['code']}"
        except (ValueError, KeyError, TypeError):
            return f"HTTP {status}"
    try:
        return request.check(json.loads(body))
    except ValueError as exc:
        return f"invalid answer: {exc}"


async def send(conn: _Connection, request: PreparedRequest, timeout_s: float) -> Outcome:
    """One request on `conn`, its answer checked; a broken connection is closed (and reopened by
    the next request)."""
    started, status = time.perf_counter(), 0
    try:
        status, body = await asyncio.wait_for(conn.post(request), timeout_s)
        error = answer_error(request, status, body)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
        conn.close()
        error = f"{type(exc).__name__}"
    except ValueError as exc:  # an unreadable status line or header
        error = f"invalid answer: {exc}"
    seconds = time.perf_counter() - started
    return Outcome(
        started, seconds, request.path.split("?")[0], status, None if error is None else error[:120]
    )


def _address(url: str, requests: Sequence[PreparedRequest]) -> tuple[str, int]:
    """(host, port) of `url`, once there is something to send to it."""
    if not requests:
        raise UserError("nothing to send")
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def run_closed_loop(
    url: str,
    requests: Sequence[PreparedRequest],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 0.0,
    max_requests: int = 1_000_000,
    timeout_s: float = REQUEST_TIMEOUT_S,
    pause_s: float = 0.0,
    stop: Callable[[], bool] = lambda: False,
) -> LoadResult:
    """`concurrency` closed-loop clients against `url` for `warmup_s` (not recorded) plus `seconds`,
    on a fresh event loop, sending at most `max_requests` in all and none once `stop()` holds;
    each waits `pause_s` between its requests. Requests sent before the end finish (or time out)."""
    host, port = _address(url, requests)
    result = LoadResult(concurrency)
    budget = [max_requests]

    async def user(index: int, conn: _Connection) -> None:
        turn = index
        while budget[0] > 0 and time.perf_counter() < stop_at and not stop():
            budget[0] -= 1
            outcome = await send(conn, requests[turn % len(requests)], timeout_s)
            turn += 1
            result.answered += 1
            if outcome.started >= measure_from:
                result.outcomes.append(outcome)
            if pause_s:
                await asyncio.sleep(pause_s)

    async def users() -> None:
        connections = [_Connection(host, port) for _ in range(concurrency)]
        try:
            await asyncio.gather(*(user(i, c) for i, c in enumerate(connections)))
        finally:
            for conn in connections:
                conn.close()

    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + seconds
    asyncio.run(users())
    # From the end of the warm-up until the last recorded request answered (closed loop: the
    # requests sent just before the end are counted, so their answering time is too).
    result.seconds = max(time.perf_counter() - measure_from, 1e-9)
    return result


async def open_loop(
    url: str,
    requests: Sequence[PreparedRequest],
    *,
    rate: float,
    seconds: float,
    max_requests: int = 1_000_000,
    max_outstanding: int = 1024,
    timeout_s: float = REQUEST_TIMEOUT_S,
    late_s: float = 0.5,
) -> LoadResult:
    """Arrivals at `rate` per second for `seconds`, request i being `requests[i % len]`, whatever
    the server answers. An arrival the client is over `late_s` late to send (it shares the CPU
    with the server), or one past `max_outstanding` open requests, is counted and not sent: what
    is sent is the load the server really saw."""
    host, port = _address(url, requests)
    result = LoadResult(0)
    idle: list[_Connection] = []
    open_requests: set[asyncio.Task[None]] = set()

    async def run(request: PreparedRequest) -> None:
        conn = idle.pop() if idle else _Connection(host, port)
        outcome = await send(conn, request, timeout_s)
        idle.append(conn)
        result.answered += 1
        result.outcomes.append(outcome)

    start = time.perf_counter()
    try:
        for i in range(min(max_requests, int(rate * seconds))):
            due = start + i / rate
            # Always yield (sleep 0 when behind), so that open requests progress while catching up.
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if time.perf_counter() - due > late_s:
                result.late += 1
            elif len(open_requests) >= max_outstanding:
                result.skipped += 1
            else:
                task = asyncio.create_task(run(requests[i % len(requests)]))
                open_requests.add(task)
                task.add_done_callback(open_requests.discard)
        arrivals_ended = time.perf_counter()
        await asyncio.gather(*open_requests)
        result.drain_s = time.perf_counter() - arrivals_ended
    finally:
        for conn in idle:
            conn.close()
    result.seconds = seconds
    return result
