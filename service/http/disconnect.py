"""Work for a request that stops when its client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from starlette.types import Receive

from service.http.errors import client_gone

T = TypeVar("T")


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


__all__ = ["unless_disconnected"]
