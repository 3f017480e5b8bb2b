"""Answers a client does not take are dropped after `send_timeout_s`, and their memory freed.

uvicorn writes an answer into the connection's transport and, when the transport's buffer is over
its high-water mark (the kernel's socket buffers are full: the client is not reading), pauses the
app's `send` until the buffer drains. A client that never reads would hold that buffer (up to the
whole answer) and the request's task for as long as the connection lives, past every request
deadline; closing the transport would not help, since asyncio flushes a closed transport's buffer
before it lets go.

So the HTTP protocol arms a timer whenever writing pauses: if the client has taken no bytes of the
buffer (its size has not gone down) within `send_timeout_s`, the connection is aborted (RST), which
drops the buffer at once and wakes the paused `send`, which sees a disconnected client. A client
that reads, however slowly, re-arms the timer with every check at which it has taken something.
Each drop is logged and counted as `gmlp_refusals_total{transport="http",code="send_timeout"}`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from service.http.connections import REFUSAL_OBSERVER

log = logging.getLogger(__name__)

SEND_TIMEOUT = "send_timeout"  # the refusal's code in gmlp_refusals_total (no answer is sent)


class SendDeadline:
    """Mixin for uvicorn's HTTP protocols: a paused write must make progress within
    `send_timeout_s` (see the module doc)."""

    send_timeout_s: ClassVar[float | None] = None
    transport: asyncio.Transport
    app_state: dict[str, Any]
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.send_timer: asyncio.TimerHandle | None = None
        self.send_mark = 0
        super().connection_made(transport)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self.send_timeout_s is not None and self.send_timer is None:
            self.send_mark = self.transport.get_write_buffer_size()
            self.send_timer = self.loop.call_later(self.send_timeout_s, self.send_stalled)

    def resume_writing(self) -> None:
        self.stop_send_timer()
        super().resume_writing()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_send_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def stop_send_timer(self) -> None:
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def send_stalled(self) -> None:
        """`send_timeout_s` after the pause (or the last check): abort if nothing was taken."""
        self.send_timer = None
        buffered = self.transport.get_write_buffer_size()
        if buffered == 0:
            return
        if buffered < self.send_mark:  # the client is reading: give it another period
            self.send_mark = buffered
            assert self.send_timeout_s is not None
            self.send_timer = self.loop.call_later(self.send_timeout_s, self.send_stalled)
            return
        peer = self.transport.get_extra_info("peername")
        log.warning(
            "dropped an answer the client did not read: %d bytes still buffered after %g s (send_timeout_s), "
            "connection from %s aborted",
            buffered,
            self.send_timeout_s,
            peer[0] if isinstance(peer, tuple) else "unknown",
        )
        self.transport.abort()
        observe = self.app_state.get(REFUSAL_OBSERVER)
        if observe is not None:
            observe("http", SEND_TIMEOUT)


def with_send_deadline(
    protocol: type[asyncio.Protocol], send_timeout_s: float | None
) -> type[asyncio.Protocol]:
    """`protocol` (one of `service.http.connections`') with the send deadline (None: none)."""
    if send_timeout_s is None:
        return protocol
    return type(protocol.__name__, (SendDeadline, protocol), {"send_timeout_s": send_timeout_s})
