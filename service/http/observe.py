"""Request ids, Server-Timing, the request's server span and the access log, for every HTTP request.

The outermost of the service's middlewares, so that every answer carries the request id, the
early refusals (connection cap, size limits) and the unexpected errors included:

- `X-Request-ID`: the client's, when acceptable (`service.engine.request_context`), else a generated one;
  echoed on the response either way;
- `Server-Timing: queue;dur=MS, infer;dur=MS, total;dur=MS` on the answer to every task request
  (POST): the longest queue wait and batch run of its rows, and the time to the response's start
  (`server_timing` turns it off);
- tracing on (`service.telemetry.tracing`): a SERVER span continuing the request's `traceparent`, the
  current span while the request is served, with a `read body` child span (from the first read of
  the body to its last byte); the span's name and `http.route` are the route template;
- `access_log`: one line per answered request (method, path, route, status, duration, client) in
  the service's log format, after the answer has gone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.engine import request_context
from service.engine.request_context import REQUEST_ID_HEADER, RequestContext
from service.http.asgi import HttpMiddleware
from service.telemetry.tracing import Tracing, epoch_ns

access_log = logging.getLogger("service.access")

_REQUEST_ID = REQUEST_ID_HEADER.encode()
_TRACE_HEADERS = (b"traceparent", b"tracestate", b"baggage")


def server_timing(request: RequestContext) -> bytes:
    """The header's value: milliseconds with a tenth, as developer tools show them."""
    return (
        f"queue;dur={request.queue_s * 1000:.1f}, infer;dur={request.infer_s * 1000:.1f}, "
        f"total;dur={request.elapsed_s() * 1000:.1f}"
    ).encode()


def _template(scope: Scope) -> str:
    return getattr(scope.get("route"), "path", None) or "<unmatched>"


class RequestObservationMiddleware(HttpMiddleware):
    """See the module docstring; `tracing` is None when tracing is off."""

    def __init__(self, app: ASGIApp, *, tracing: Tracing | None, timing: bool, access: bool) -> None:
        super().__init__(app)
        self.tracing = tracing
        self.timing = timing
        self.access = access

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = None
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name == _REQUEST_ID:
                given = value
            elif name in _TRACE_HEADERS:
                carrier[name.decode()] = value.decode("latin-1")
        method = scope["method"]
        request = RequestContext(request_context.accepted_request_id(given), "http", method=method)
        request_id = request.request_id.encode()
        timing = self.timing and method == "POST"
        status = 500
        body_times: list[float] = []
        tracing, token = self.tracing, None
        if tracing is not None:
            attributes = {
                "http.request.method": method,
                "url.path": scope["path"],
                "gmlp.request_id": request.request_id,
            }
            request.span = tracing.start_server_span(method, carrier, attributes)
            request.tracer = tracing
            token = tracing.activate(request.span)

        async def timed_receive() -> Message:
            if not body_times:
                body_times.append(time.monotonic())
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_times.append(time.monotonic())
            return message

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                headers.append((_REQUEST_ID, request_id))
                if timing:
                    headers.append((b"server-timing", server_timing(request)))
                message = {**message, "headers": headers}
            await send(message)

        with request_context.open_request(request):
            try:
                traced = tracing is not None and request.span.is_recording()
                await self.app(scope, timed_receive if traced else receive, observed_send)
            finally:
                route = _template(scope)
                request.route = route
                if tracing is not None:
                    self._end_span(tracing, request, route, status, body_times)
                    tracing.deactivate(token)
                if self.access:
                    self._log(scope, request, status)

    @staticmethod
    def _end_span(
        tracing: Tracing, request: RequestContext, route: str, status: int, body_times: list[float]
    ) -> None:
        if len(body_times) == 2 and request.span.is_recording():
            to_ns = epoch_ns()
            tracing.span_between("read body", request.span, to_ns(body_times[0]), to_ns(body_times[1]))
        request.span.update_name(f"{request.method} {route}")
        attributes: dict[str, Any] = {"http.route": route, "http.response.status_code": status}
        tracing.end_server_span(request, str(status), attributes, failed=status >= 500)

    @staticmethod
    def _log(scope: Scope, request: RequestContext, status: int) -> None:
        duration_ms = round(request.elapsed_s() * 1000, 3)
        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "-"
        access_log.info(
            '%s "%s %s" %d %.1fms',
            peer,
            request.method,
            scope["path"],
            status,
            duration_ms,
            extra={"status": status, "duration_ms": duration_ms, "path": scope["path"], "client": peer},
        )


__all__ = ["RequestObservationMiddleware", "server_timing"]
