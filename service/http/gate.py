"""The request gate: every check a request passes before a route runs, the route's dispatch, and the
one exception path, in one pass over one match (`service.http.routing.RouteTable`).

In order, each refusal in the shape of the API of the route the request is for (`ErrorResponder`):

1. the connection cap: a request the protocol marked as over `max_connections`
   (`service.http.connections`): 503 with `Retry-After` and `Connection: close`, REST shape, counted
   under the "http" transport;
2. the request head: 431 over `max_header_bytes` (request line plus headers); 400 for an HTTP/1.1
   request without exactly one Host header (RFC 9112, 3.2); 404 for a path with a control character
   once decoded (the routes' patterns end in `$`, which also matches before a final newline, so
   without this every route would answer its path plus `%0A`); 421 for a Host the service does not
   answer for without API keys (DNS rebinding: `service.http.hosts`), health routes included (a
   probe names the pod's address);
3. access: the key the matched route declares, checked before anything reads the body (401 with
   `WWW-Authenticate: Bearer`, 403 without the scope, 429 with `Retry-After` over the key's rate);
4. the body: 415 for a `Content-Encoding` other than identity (a body small on the wire may inflate
   far beyond the limit, and no route inflates one), 413 early from Content-Length, and by counting
   what is read (chunked uploads, lying headers), so no request makes us buffer more than
   `max_upload_bytes`. While the body is still
   arriving the request is marked (`BODY_PENDING`): a deadline that passes then is the client's
   slowness, answered 408 with the connection closed, not 504;
5. dispatch: a `DirectRoute`'s endpoint is called with the Request and its path parameters, any
   other route (the OpenAPI document, the static mounts, a wrong method's 405) handles the request
   itself, no route is a 404; what any raises is answered by `ErrorResponder.exception` (a bug: 500,
   logged once with the request). A route that needs FastAPI's injection (none of the service's
   own; one a test adds) is handed to FastAPI's router, the app this gate wraps.

The route is recorded in the request's scope (the metrics' label) when it is dispatched: a request
refused before that is counted as `<unmatched>`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette._utils import get_route_path  # the router's own rule, as FastAPI's router uses it
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract.errors import ErrorCode, HeadersTooLarge, MalformedRequest, RequestError, RouteNotFound
from contract.messages import CONTROL_CHARACTERS
from service.access.keys import KeyStore, presented_key
from service.access.scope import Scope as KeyScope
from service.http.connections import OVER_CAP, too_many_connections
from service.http.errors import (
    BODY_PENDING,
    CONNECTION_ERRORS,
    ErrorResponder,
    content_encoded,
    payload_too_large,
)
from service.http.hosts import HostRule
from service.http.routing import DirectRoute, RouteTable

log = logging.getLogger(__name__)

KEY_HEADERS = (b"authorization", b"x-api-key")  # where a request presents its key (`presented_key`)
# The bytes a request line adds besides its target: "GET " + " HTTP/1.1\r\n".
_LINE_OVERHEAD = 16


@dataclass
class RequestGate:
    """The innermost of the service's middlewares, and the end of every HTTP request (see the
    module doc): FastAPI's router, the app it wraps, sees the lifespan, and only the requests for
    routes that need FastAPI's injection."""

    app: ASGIApp
    _: KW_ONLY
    table: RouteTable
    errors: ErrorResponder
    keys: KeyStore
    max_header_bytes: int
    max_body_bytes: int
    hosts: HostRule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (cap := scope.get("extensions", {}).get(OVER_CAP)) is not None:
            response = self.errors.answer(CONNECTION_ERRORS, too_many_connections(cap))
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        route, needed, child = self.table.route(scope["method"], get_route_path(scope))
        try:
            await self.admit(scope, needed)
        except RequestError as refusal:
            await self.errors.response(scope, refusal, route=route)(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.dispatch(route, child, scope, self.limited(scope, receive), watched_send)
        except Exception as exc:
            if started:  # too late for an answer: uvicorn closes the connection of an unfinished one
                log.exception("error after the answer began on %s %s", scope["method"], scope["path"])
                return
            await self.errors.exception(scope, exc, route)(scope, receive, send)

    async def admit(self, scope: Scope, needed: KeyScope | None) -> None:
        """Raises the refusal of the request's head or of its key, if any."""
        # The size of the request line (path, `?` and query string) and the headers, as sent.
        query = scope.get("query_string") or b""
        target = len(scope.get("raw_path") or scope["path"].encode()) + (len(query) + 1 if query else 0)
        size = _LINE_OVERHEAD + target + sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        limit = self.max_header_bytes
        if size > limit:
            raise HeadersTooLarge(
                ErrorCode.HEADERS_TOO_LARGE,
                f"the request line and headers are {size} bytes; at most {limit} are accepted",
            )
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        if scope.get("http_version") == "1.1" and len(hosts) != 1:
            raise MalformedRequest(
                ErrorCode.BAD_REQUEST,
                f"an HTTP/1.1 request needs exactly one Host header; this one has {len(hosts)}",
            )
        if CONTROL_CHARACTERS.search(scope["path"]):
            raise RouteNotFound(
                ErrorCode.NOT_FOUND, "no endpoint has this path: a path may not hold control characters"
            )
        self.hosts.check(hosts[0] if hosts else None)
        if needed is not None and needed not in self.keys.open_scopes:
            presented = [
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k in KEY_HEADERS
            ]
            await self.keys.authorize(presented_key(presented), needed, "http")

    def limited(self, scope: Scope, receive: Receive) -> Receive:
        """`receive`, counting the body against the limit (413 at once when Content-Length is over
        it) and marking the request while its body arrives."""
        headers = dict(scope["headers"])
        coded = [v for k, v in scope["headers"] if k == b"content-encoding"]
        if any(c.strip().lower() not in (b"", b"identity") for v in coded for c in v.split(b",")):
            raise content_encoded(b", ".join(coded).decode("latin-1"))
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            raise payload_too_large(self.max_body_bytes)
        scope[BODY_PENDING] = b"transfer-encoding" in headers or (length is not None and int(length) > 0)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise payload_too_large(self.max_body_bytes)
                if not message.get("more_body", False):
                    scope[BODY_PENDING] = False
            return message

        return limited_receive

    async def dispatch(
        self,
        route: BaseRoute | None,
        child: Mapping[str, Any] | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Runs the matched route; `child`: the scope entries of a full match, as the table found
        them for this method and path (a direct route's, with a copy of its path parameters)."""
        if route is None:
            raise HTTPException(status_code=404)  # answered as Starlette's router answers it
        if isinstance(route, APIRoute) and not isinstance(route, DirectRoute):
            await self.app(scope, receive, send)  # it needs FastAPI's injection: FastAPI's router
            return
        child_scope: Mapping[str, Any]
        if child is not None and isinstance(route, DirectRoute):
            match, child_scope = Match.FULL, {**child, "path_params": dict(child["path_params"])}
        else:
            match, child_scope = route.matches(scope)
        scope.update(child_scope)  # the route, its endpoint and its path parameters
        if match is Match.PARTIAL:  # the path of a route that takes other methods
            raise HTTPException(status_code=405, headers={"Allow": ", ".join(getattr(route, "methods", ()))})
        if isinstance(route, DirectRoute):
            response = await route.endpoint(Request(scope, receive, send), **scope["path_params"])
            await response(scope, receive, send)
        else:
            await route.handle(scope, receive, send)
