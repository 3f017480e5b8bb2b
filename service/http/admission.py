"""Admission of HTTP connections at accept: every connection counted against `max_connections`
from the moment it is accepted, TLS handshakes included.

uvicorn counts a connection only once its HTTP protocol runs, which under TLS is after the
handshake: a client that never finishes one held a descriptor, uncounted, for asyncio's 60 s. So
the service does TLS itself: uvicorn listens in plain TCP and its protocol factory is
`TlsHandshake`, which counts the connection at once, upgrades it with `loop.start_tls` within
`header_timeout_s` (else closes it, a `request_timeout` refusal as late headers are) and hands it
to the HTTP protocol.

At the cap (`admit`) the oldest idle keep-alive connection is closed to make room, as nginx drains
its reusable ones, so that a client holding many idle connections cannot lock everyone else out.
Only when none is idle is the newcomer refused: over plain HTTP with a 503 (`too_many_connections`,
Retry-After, `Connection: close`) at once, without reading its request, then closed when the
client closes or after `header_timeout_s` (`Refusal`; at most `max_connections` linger, beyond
which a newcomer is closed unanswered); over TLS it is closed before any handshake work.
Connections waiting for their first request are not idle: the header deadline bounds them.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import weakref
from collections.abc import Coroutine
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from contract.errors import ErrorCode

# Key, in the lifespan state, of the callable that counts connections the server closed itself:
# `(transport, reason)`, as `ServiceMetrics.connection_closed` (reasons: "idle_evicted").
CLOSE_OBSERVER = "gmlp.connection_closed"
REFUSAL_OBSERVER = "gmlp.refused"

# The refused connections still lingering (answer sent, waiting for the client to close), per server.
_lingering: weakref.WeakKeyDictionary[ServerState, set[Refusal]] = weakref.WeakKeyDictionary()


def observe(app_state: dict[str, Any], key: str, *args: str) -> None:
    """Call the observer under `key` in the lifespan state, when the app put one there."""
    if (observer := app_state.get(key)) is not None:
        observer(*args)


# Stamps the order in which connections became idle (a timer's deadline cannot: uvloop's clock
# ticks in milliseconds, and several answers fit in one).
idle_order = itertools.count()


def _idle_since(protocol: Any) -> int | None:
    """When an idle keep-alive connection's wait began (its `idle_stamp`, taken from `idle_order`
    as its answer completed), or None when it is not idle: uvicorn's protocols arm their
    keep-alive timer once a response is complete and drop it at the next byte."""
    if getattr(protocol, "timeout_keep_alive_task", None) is None:
        return None
    transport = getattr(protocol, "transport", None)
    if transport is None or transport.is_closing():
        return None
    return getattr(protocol, "idle_stamp", None)


def admit(cap: int | None, server_state: ServerState, app_state: dict[str, Any]) -> bool:
    """Whether a newly accepted connection may take a slot: below the cap, or at it once the oldest
    idle keep-alive connection is closed (as its keep-alive timeout would)."""
    connections: set[Any] = server_state.connections
    if cap is None or len(connections) < cap:
        return True
    idle = [(since, id(p), p) for p in connections if (since := _idle_since(p)) is not None]
    if not idle:
        return False
    oldest = min(idle)[2]
    oldest.timeout_keep_alive_handler()
    connections.discard(oldest)  # its slot is free now; connection_lost follows
    observe(app_state, CLOSE_OBSERVER, "http", "idle_evicted")
    return True


class Refusal(asyncio.Protocol):
    """A connection over the cap: `answer` sent at once, then half-closed; what the client sends is
    discarded (closing with unread data would reset the connection and could lose the answer) until
    it closes or `linger_s` passes."""

    def __init__(
        self, transport: asyncio.Transport, server_state: ServerState, answer: bytes, linger_s: float
    ) -> None:
        self.transport = transport
        self.lingering = _lingering.setdefault(server_state, set())
        self.lingering.add(self)
        transport.set_protocol(self)
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(linger_s, transport.close)

    def eof_received(self) -> bool:
        self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lingering.discard(self)
        self.timer.cancel()


def refuse(
    transport: asyncio.Transport, server_state: ServerState, cap: int, answer: bytes, linger_s: float
) -> None:
    """Answer a connection refused at accept with `answer` (see `Refusal`), or close it at once
    when as many refused connections as the cap already linger."""
    if len(_lingering.get(server_state, ())) >= cap:
        transport.abort()
        return
    Refusal(transport, server_state, answer, linger_s)


class TlsHandshake(asyncio.Protocol):
    """uvicorn's protocol factory under TLS (see the module doc): counts the connection from accept,
    runs the handshake within `handshake_timeout_s`, then hands the TLS transport to the HTTP
    protocol (`http`), marked as already admitted. Subclassed per server (`tls_protocol`)."""

    http: type[asyncio.Protocol]
    context: ssl.SSLContext
    handshake_timeout_s: float

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config, self.server_state, self.app_state = config, server_state, app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.early: list[bytes] = []  # application data decrypted before the hand-over
        self.early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        if not admit(self.config.limit_concurrency, self.server_state, self.app_state):
            transport.abort()  # no handshake work for a connection that has no room
            observe(self.app_state, REFUSAL_OBSERVER, "http", ErrorCode.TOO_MANY_CONNECTIONS)
            return
        self.raw = transport  # counted from here on, so uvicorn's shutdown finds it
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self.started = self.loop.time()
        starting = self.loop.start_tls(
            transport, self, self.context, server_side=True, ssl_handshake_timeout=self.handshake_timeout_s
        )
        self.step(starting)

    def step(self, starting: Coroutine[Any, Any, asyncio.Transport | None]) -> None:
        """Drive `loop.start_tls` by hand, its first step now, inside `connection_made`: it must make
        the TLS protocol the transport's own before a byte is read (uvloop starts reading as soon
        as `connection_made` returns, paused or not), or the ClientHello would reach this one."""
        tls: asyncio.Transport | None = None
        try:
            waiting = starting.send(None)
        except StopIteration as done:
            tls = done.value
        except Exception:  # start_tls has closed the connection
            if self.loop.time() - self.started >= self.handshake_timeout_s:  # not refused: late
                observe(self.app_state, REFUSAL_OBSERVER, "http", ErrorCode.REQUEST_TIMEOUT)
        else:  # start_tls waits on its handshake's future
            waiting.add_done_callback(lambda _: self.step(starting))
            return
        self.server_state.connections.discard(self)
        self.hand_over(tls)

    def hand_over(self, tls: asyncio.Transport | None) -> None:
        """The HTTP protocol takes the TLS transport, with what arrived with the handshake."""
        if tls is None or tls.is_closing():
            return
        inner: Any = self.http(config=self.config, server_state=self.server_state, app_state=self.app_state)  # type: ignore[call-arg]
        inner.admitted = True
        tls.set_protocol(inner)
        inner.connection_made(tls)
        for data in self.early:
            inner.data_received(data)
        if self.early_eof:
            inner.eof_received()

    # Until the hand-over the TLS transport's protocol is this one.
    def data_received(self, data: bytes) -> None:
        self.early.append(data)

    def eof_received(self) -> bool:
        self.early_eof = True
        return True

    def shutdown(self) -> None:
        """uvicorn's shutdown of every connection it counts: a handshake in progress is dropped."""
        self.raw.close()


def tls_protocol(
    http: type[asyncio.Protocol], context: ssl.SSLContext, handshake_timeout_s: float
) -> type[asyncio.Protocol]:
    """The protocol factory of an HTTPS server: `TlsHandshake` with this HTTP protocol, context and
    handshake limit."""
    attributes = {"http": http, "context": context, "handshake_timeout_s": handshake_timeout_s}
    return type(f"Tls{http.__name__}", (TlsHandshake,), attributes)
