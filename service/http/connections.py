"""The connection cap (`max_connections`), answered in the service's own error shape.

uvicorn's `limit_concurrency` is what keeps idle or slow clients from exhausting file descriptors:
beyond that many open connections (or requests in flight) a new request is refused at once. But
uvicorn refuses with its own plain-text 503, without `Retry-After` and unseen by our metrics. So
the HTTP protocol uvicorn runs is a small subclass of its own (httptools or h11, as uvicorn's
"auto" picks): it keeps uvicorn's test, on uvicorn's own sets of connections and tasks, but instead
of answering, it marks the request's scope; `ConnectionCapMiddleware`, outermost in the app,
answers marked requests from the error table before anything else runs, with `Connection: close`
so that the refused connection is released at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from contract.errors import ErrorCode, Unavailable
from service.http.asgi import HttpMiddleware
from service.http.errors import CONNECTION_ERRORS, ErrorResponder

# Scope extension set on a request that arrived over the cap; its value is the cap.
OVER_CAP = "gmlp.connection_cap"


class ConnectionCap:
    """Mixin for uvicorn's HTTP protocols: uvicorn's `limit_concurrency` test, answered by the app.

    uvicorn tests the cap just before it starts a request's task and answers with its fixed
    plain-text app; here its own test is switched off (`limit_concurrency = None`) and made when
    the task runs, on the same sets, and the request goes on to the app marked with `OVER_CAP`.
    """

    connections: set[Any]
    tasks: set[asyncio.Task[None]]
    limit_concurrency: int | None
    app: ASGIApp

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self.connection_cap = self.limit_concurrency
        self.limit_concurrency = None
        self.inner_app = self.app
        self.app = self.capped_app

    def over_cap(self) -> bool:
        """uvicorn's test. The running request's own task is already among `tasks` here, whereas
        uvicorn tests before adding it; its connection is among `connections` in both."""
        cap = self.connection_cap
        return cap is not None and (len(self.connections) >= cap or len(self.tasks) - 1 >= cap)

    async def capped_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.over_cap():
            scope.setdefault("extensions", {})[OVER_CAP] = self.connection_cap
        await self.inner_app(scope, receive, send)


class CappedH11Protocol(ConnectionCap, H11Protocol):
    """uvicorn's h11 protocol with the cap answered by the app."""


# By name, as uvicorn's `http` option spells them; httptools only where it is installed.
PROTOCOLS: dict[str, type[asyncio.Protocol]] = {"h11": CappedH11Protocol}
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - the serving image installs uvicorn[standard]
    pass
else:

    class CappedHttpToolsProtocol(ConnectionCap, HttpToolsProtocol):
        """uvicorn's httptools protocol with the cap answered by the app."""

    PROTOCOLS["httptools"] = CappedHttpToolsProtocol


def http_protocol() -> type[asyncio.Protocol]:
    """The capped protocol uvicorn's "auto" would pick: httptools when installed, else h11."""
    return PROTOCOLS.get("httptools", CappedH11Protocol)


def too_many_connections(cap: int) -> Unavailable:
    return Unavailable(
        ErrorCode.TOO_MANY_CONNECTIONS,
        f"the server holds its limit of {cap} open connections (max_connections); close idle "
        "connections or retry after the Retry-After delay",
    )


class ConnectionCapMiddleware(HttpMiddleware):
    """Answers requests the protocol marked as over the cap (503, Retry-After, Connection: close),
    counted as refusals of the "http" transport. Outermost, so nothing else runs for them."""

    def __init__(self, app: ASGIApp, errors: ErrorResponder) -> None:
        super().__init__(app)
        self.errors = errors

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = scope.get("extensions", {}).get(OVER_CAP)
        if cap is None:
            await self.app(scope, receive, send)
            return
        response = self.errors.answer(CONNECTION_ERRORS, too_many_connections(cap))
        response.headers["connection"] = "close"
        await response(scope, receive, send)


__all__ = [
    "ConnectionCapMiddleware",
    "ConnectionCap",
    "PROTOCOLS",
    "http_protocol",
    "too_many_connections",
    "OVER_CAP",
]
