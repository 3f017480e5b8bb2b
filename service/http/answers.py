"""A route's work and its answer: the work stops when the client goes away (`unless_disconnected`,
every HTTP API), and the task routes' and the Hugging Face API's JSON answers are encoded off the
event loop when big (`json_answer`).

Their size follows from what was asked (top_k labels per image; top_k predictions, or one per
target, per [MASK]), all bounded by the request limits (top_k <= 100, at most 1000 targets, the
model's max_predictions [MASK]s). Most answers are a few hundred bytes and are encoded in place;
one of many ranked entries is encoded in a worker thread (`service.engine.request_context`), so that no
answer pauses the loop that serves every other request and probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import Receive

from service.engine.request_context import encode_off_loop
from service.http.errors import client_gone

T = TypeVar("T")

# A generous bound of one ranked entry's JSON: label or token text, score, id, sequence prefix.
ENTRY_BYTES = 256


def ranked_entries(predictions: Any) -> int:
    """How many ranked entries an answer holds: a list of them, or a list of lists (per [MASK])."""
    if not isinstance(predictions, list):
        return 1
    return sum(len(item) if isinstance(item, list) else 1 for item in predictions)


async def json_answer(body: Any, predictions: Any) -> JSONResponse:
    """`body` as a JSON response; encoded in a worker thread when `predictions` make it big."""
    return await encode_off_loop(lambda: JSONResponse(body), ENTRY_BYTES * ranked_entries(predictions))


async def _wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client goes away; the body has been read, so the next message is the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it if the client disconnects first (ClientGone then).

    Cancelling the batcher submission withdraws the request from the queue, so the model never
    runs for a client that is gone (e.g. one that timed out on its side and retried). `work` runs
    in the caller's own task, which a watcher of the connection cancels: one task per request
    rather than two and a wait on both.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = finished = False

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        # `finished`: a callback already scheduled when `work` ended must not cancel what follows.
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            task.cancel()

    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise client_gone() from None
    finally:
        finished = True
        watcher.cancel()


__all__ = ["ENTRY_BYTES", "json_answer", "ranked_entries", "unless_disconnected"]
