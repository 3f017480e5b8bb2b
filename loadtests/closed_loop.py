"""A bounded closed-loop HTTP/1.1 load generator on asyncio: N connections, each sending its next
request as soon as the last one answered, for a fixed time and at most a fixed count.

`gmlp loadtest` drives locust, whose processes take seconds to start: right for a sweep a person
reads, too slow for a tuner that measures dozens of short windows. This client sends the same
inputs (the bundled CIFAR-10 JPEGs and masked sentences of `loadtests.workload`), checks every
answer with `loadtests.checks` (a fast wrong answer is a failure), and keeps keep-alive
connections open as a real client would. Standard library only: raw HTTP/1.1 over asyncio streams
(Content-Length and chunked bodies), one event loop in the calling thread.
"""

from __future__ import annotations

import asyncio
import json
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
from loadtests.workload import LoadConfig, fitting, load_images, load_sentences

# A request that has not answered within this is a failure (and its connection is dropped).
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PreparedRequest:
    """One POST, encoded once: its path with query, body, content type and the answer's check."""

    path: str
    body: bytes
    content_type: str
    check: Callable[[Any], str | None]


@dataclass
class LoadResult:
    """What one closed-loop window measured: latencies of the good answers, failures by reason."""

    concurrency: int
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    answered: int = 0  # every request that finished, the warm-up's included (for CPU per request)

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def rps(self) -> float:
        """Good answers per second over the measured window."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile (0-100) of the good answers' latency, nearest rank; None without any."""
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[rank - 1]

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "seconds": round(self.seconds, 3),
            "requests": self.ok,
            "failures": self.failed,
            "failure_reasons": dict(self.failures.most_common(5)),
            "rps": round(self.rps, 2),
            "p50_ms": _round(self.percentile_ms(50)),
            "p99_ms": _round(self.percentile_ms(99)),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def task_requests(task: str, model: str, n_tokens: int | None, top_k: int = 5) -> list[PreparedRequest]:
    """The requests of `loadtests.workload` for one model: /classify with each bundled JPEG (raw
    body), or /fill-mask with each bundled masked sentence that fits its window of `n_tokens`."""
    config = LoadConfig(top_k=top_k)
    if task == VISION_TASK:
        images, _ = load_images(None)
        path = "/classify?" + urlencode({"model": model, "top_k": top_k})
        check = _classify_check(top_k, model)
        return [PreparedRequest(path, image, "image/jpeg", check) for image in images]
    if task == MLM_TASK:
        sentences = fitting(load_sentences(config)[0], n_tokens)
        if not sentences:
            raise UserError(f"no bundled sentence fits {model}'s window of {n_tokens} tokens")
        return [
            PreparedRequest(
                "/fill-mask",
                json.dumps({"text": s.text, "top_k": top_k, "model": model}).encode(),
                "application/json",
                _fill_mask_check(s.text, top_k, model),
            )
            for s in sentences
        ]
    raise UserError(f"model {model} serves {task!r}; the load generator sends {VISION_TASK} and {MLM_TASK}")


def _classify_check(top_k: int, model: str) -> Callable[[Any], str | None]:
    return lambda body: check_classify(body, top_k, model)


def _fill_mask_check(text: str, top_k: int, model: str) -> Callable[[Any], str | None]:
    return lambda body: check_fill_mask(body, text, top_k, model)


class _Connection:
    """One keep-alive HTTP/1.1 connection, reopened when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: PreparedRequest) -> tuple[int, bytes]:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {request.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
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
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are sent to us: the closing empty line
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


def _failure(status: int, body: bytes) -> str:
    try:
        return f"HTTP {status} {json.loads(body)['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


async def _user(
    index: int,
    conn: _Connection,
    requests: Sequence[PreparedRequest],
    result: LoadResult,
    window: tuple[float, float],
    budget: list[int],
) -> None:
    """One closed-loop client: request after request until the window ends or the count is spent;
    only requests sent inside the window (after the warm-up) are recorded."""
    measure_from, stop_at = window
    turn = index
    while budget[0] > 0 and (sent := time.perf_counter()) < stop_at:
        budget[0] -= 1
        request = requests[turn % len(requests)]
        turn += 1
        try:
            status, body = await asyncio.wait_for(conn.post(request), REQUEST_TIMEOUT_S)
            error = _failure(status, body) if status != 200 else request.check(json.loads(body))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            conn.close()
            error = f"{type(exc).__name__}"
        except ValueError as exc:
            error = f"invalid answer: {exc}"[:120]
        result.answered += 1
        if sent < measure_from:
            continue
        if error:
            result.failures[error[:120]] += 1
        else:
            result.latencies_ms.append(1000 * (time.perf_counter() - sent))


async def closed_loop(
    url: str,
    requests: Sequence[PreparedRequest],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 0.0,
    max_requests: int = 1_000_000,
) -> LoadResult:
    """`concurrency` closed-loop clients against `url` for `warmup_s` (not recorded) plus `seconds`,
    sending at most `max_requests` in all; requests sent before the end finish (or time out)."""
    if not requests:
        raise UserError("nothing to send")
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    result = LoadResult(concurrency)
    start = time.perf_counter()
    window = (start + warmup_s, start + warmup_s + seconds)
    budget = [max_requests]
    connections = [_Connection(host, port) for _ in range(concurrency)]
    try:
        await asyncio.gather(
            *(_user(i, c, requests, result, window, budget) for i, c in enumerate(connections))
        )
    finally:
        for conn in connections:
            conn.close()
    # From the end of the warm-up until the last recorded request answered (closed loop: the
    # requests sent just before the end are counted, so their answering time is too).
    result.seconds = max(time.perf_counter() - window[0], 1e-9)
    return result


def run_closed_loop(
    url: str,
    requests: Sequence[PreparedRequest],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 0.0,
    max_requests: int = 1_000_000,
) -> LoadResult:
    """`closed_loop` on a fresh event loop (for callers that are not async)."""
    return asyncio.run(
        closed_loop(
            url,
            requests,
            concurrency=concurrency,
            seconds=seconds,
            warmup_s=warmup_s,
            max_requests=max_requests,
        )
    )


__all__ = ["LoadResult", "PreparedRequest", "closed_loop", "run_closed_loop", "task_requests"]
