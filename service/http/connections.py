"""uvicorn's HTTP protocols, ours: the connection cap answered in the service's error shape, and
the deadlines of a request's headers and of an answer's sending.

uvicorn's `limit_concurrency` keeps idle or slow clients from exhausting file descriptors, but
refuses with its own plain-text 503, without `Retry-After` and unseen by our metrics. So the
protocol uvicorn runs is a subclass of its own (httptools or h11, as its "auto" picks) that keeps
its test on requests in flight, on uvicorn's own sets, but marks the request's scope instead of
answering; the request gate (`service.http.gate`) answers it from the error table, with
`Connection: close`. The cap on connections themselves is applied at accept
(`service.http.admission`).

Header deadline: a request line and headers must arrive within `header_timeout_s`, from the
connection's start or from the first byte of a further request on a kept-alive connection. A
client that has sent part of a request by then is answered 408 (REST shape, `Connection: close`);
one that sent nothing is closed without an answer (a pooled client could take an unsolicited 408
for the answer to its next request). Both count as `request_timeout` refusals of the "http"
transport. The body's limit is the request's deadline (`service.http.gate`).

Send deadline: uvicorn pauses the app's `send` while the transport's buffer is over its high-water
mark (the client is not reading); a client that never reads would hold that buffer and the
request's task for as long as the connection lives, and closing the transport would not help
(asyncio flushes a closed transport's buffer first). So whenever writing pauses a timer is armed:
if the client has taken no bytes within `send_timeout_s`, the connection is aborted (RST), which
drops the buffer and wakes the paused `send`; a client that reads, however slowly, re-arms it.
Each drop is logged and counted as a `send_timeout` refusal of the "http" transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar, cast

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from contract.errors import ErrorCode, RequestError, RequestTimeout, Unavailable
from service.http.admission import REFUSAL_OBSERVER, admit, idle_order, observe, refuse
from service.http.errors import rest_body

log = logging.getLogger(__name__)

# Scope extension set on a request that arrived over the cap; its value is the cap.
OVER_CAP = "gmlp.connection_cap"
# How long a connection refused at accept may linger when no header deadline is set.
REFUSAL_LINGER_S = 5.0
SEND_TIMEOUT = "send_timeout"  # the refusal's code in gmlp_refusals_total (no answer is sent)


def raw_answer(status: str, error: RequestError, headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 answer in the REST error shape with `Connection: close`, as bytes: for what the
    protocols answer themselves, outside any request's cycle."""
    body = json.dumps(rest_body(error)).encode()
    fields = {"content-type": "application/json", "connection": "close", **(headers or {})}
    fields["content-length"] = str(len(body))
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode() + body


class Deadlines:
    """Mixin for uvicorn's HTTP protocols: a request line and headers must arrive within
    `header_timeout_s`, a paused write must make progress within `send_timeout_s` (see the module
    doc). Both protocols start a request's cycle (`cycle`) once its headers are parsed, which is
    what ends the header wait."""

    header_timeout_s: ClassVar[float | None] = None
    send_timeout_s: ClassVar[float | None] = None
    transport: asyncio.Transport
    cycle: Any
    app_state: dict[str, Any]
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.send_timer: asyncio.TimerHandle | None = None
        self.send_mark = 0
        super().connection_made(transport)  # type: ignore[misc]
        self.header_timer: asyncio.TimerHandle | None = None
        self.timed_cycle: Any = None
        self.bytes_waiting = False
        self.arm()

    def arm(self) -> None:
        if self.header_timeout_s is not None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self.headers_late)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def data_received(self, data: bytes) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self.header_timer is None:
            self.arm()  # the first byte of a further request on a kept-alive connection
        self.bytes_waiting = self.bytes_waiting or waiting
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not self.timed_cycle:  # a new request's headers are complete
            self.timed_cycle = self.cycle
            self.bytes_waiting = False
            self.disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.stop_send_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def headers_late(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        if self.bytes_waiting:
            error = RequestTimeout(
                ErrorCode.REQUEST_TIMEOUT,
                f"the request line and headers did not arrive within {self.header_timeout_s:g} s "
                "(header_timeout_s); the connection is closed",
            )
            self.transport.write(raw_answer("408 Request Timeout", error))
        self.transport.close()
        observe(self.app_state, REFUSAL_OBSERVER, "http", ErrorCode.REQUEST_TIMEOUT)

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self.send_timeout_s is not None and self.send_timer is None:
            self.send_mark = self.transport.get_write_buffer_size()
            self.send_timer = self.loop.call_later(self.send_timeout_s, self.send_stalled)

    def resume_writing(self) -> None:
        self.stop_send_timer()
        super().resume_writing()  # type: ignore[misc]

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
            extra={"client_caused": True},
        )
        self.transport.abort()
        observe(self.app_state, REFUSAL_OBSERVER, "http", SEND_TIMEOUT)


class ConnectionCap:
    """Mixin for uvicorn's HTTP protocols: the cap on connections applied when a plain connection is
    made (one through TLS was `admitted` before its handshake), and uvicorn's test on requests in
    flight made when the request's task runs instead of before (its own switched off:
    `limit_concurrency = None`), the request going on to the app marked with `OVER_CAP`."""

    connections: set[Any]
    tasks: set[asyncio.Task[None]]
    limit_concurrency: int | None
    app: ASGIApp
    server_state: ServerState
    app_state: dict[str, Any]
    header_timeout_s: ClassVar[float | None] = None
    admitted = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (config, server_state, app_state, _loop)
        super().__init__(*args, **kwargs)
        self.connection_cap = self.limit_concurrency
        self.limit_concurrency = None
        self.inner_app = self.app
        self.app = self.capped_app

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cap = self.connection_cap
        if self.admitted or admit(cap, self.server_state, self.app_state):
            super().connection_made(transport)  # type: ignore[misc]
            return
        assert cap is not None
        answer = raw_answer("503 Service Unavailable", too_many_connections(cap), {"retry-after": "1"})
        refuse(
            cast(asyncio.Transport, transport),
            self.server_state,
            cap,
            answer,
            self.header_timeout_s or REFUSAL_LINGER_S,
        )
        observe(self.app_state, REFUSAL_OBSERVER, "http", ErrorCode.TOO_MANY_CONNECTIONS)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self.idle_stamp = next(idle_order)  # for eviction, oldest idle first

    async def capped_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """uvicorn's test on requests in flight. The running request's own task is already among
        `tasks` here, whereas uvicorn tests before adding it."""
        cap = self.connection_cap
        if scope["type"] == "http" and cap is not None and len(self.tasks) - 1 >= cap:
            scope.setdefault("extensions", {})[OVER_CAP] = cap
        await self.inner_app(scope, receive, send)


class CappedH11Protocol(ConnectionCap, Deadlines, H11Protocol):
    """uvicorn's h11 protocol with the cap answered by the app, the header and send deadlines."""


# By name, as uvicorn's `http` option spells them; httptools only where it is installed.
PROTOCOLS: dict[str, type[asyncio.Protocol]] = {"h11": CappedH11Protocol}
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - the serving image installs uvicorn[standard]
    pass
else:

    class CappedHttpToolsProtocol(ConnectionCap, Deadlines, HttpToolsProtocol):
        """uvicorn's httptools protocol with the cap answered by the app, the header and send
        deadlines."""

    PROTOCOLS["httptools"] = CappedHttpToolsProtocol


def http_protocol(
    header_timeout_s: float | None = None, name: str | None = None, send_timeout_s: float | None = None
) -> type[asyncio.Protocol]:
    """The capped protocol uvicorn's "auto" would pick (httptools when installed, else h11), or the
    one `name`d, with its header and send deadlines (None: none)."""
    base = PROTOCOLS[name] if name is not None else PROTOCOLS.get("httptools", CappedH11Protocol)
    deadlines = {"header_timeout_s": header_timeout_s, "send_timeout_s": send_timeout_s}
    return type(base.__name__, (base,), deadlines)


def too_many_connections(cap: int) -> Unavailable:
    return Unavailable(
        ErrorCode.TOO_MANY_CONNECTIONS,
        f"the server holds its limit of {cap} open connections (max_connections); close idle "
        "connections or retry after the Retry-After delay",
    )
