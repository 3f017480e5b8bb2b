"""What every HTTP request leaves behind: its metrics, request id, server span and access-log
line. The outermost of the service's middlewares, so that every answer is seen, the
early refusals and the unexpected errors included:

- `gmlp_http_requests_total` and `gmlp_http_request_duration_seconds` by *route template* (never
  the raw path, so that a scanner cannot blow up the label cardinality; `<unmatched>` for a request
  no route took), method and final status, and the requests in flight;
- `X-Request-ID`: the client's when acceptable (`service.engine.request_context`), else generated;
- with tracing on (`service.telemetry.tracing`), a SERVER span continuing the request's
  `traceparent`, named by the route template, with a `read body` child span;
- `access_log`: one line per answered request, in the service's log format, after the answer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.engine import request_context
from service.engine.request_context import REQUEST_ID_HEADER, RequestContext
from service.telemetry.metrics import ServiceMetrics
from service.telemetry.tracing import Tracing, epoch_ns

access_log = logging.getLogger("service.access")

_REQUEST_ID = REQUEST_ID_HEADER.encode()
_TRACE_HEADERS = (b"traceparent", b"tracestate", b"baggage")


@dataclass
class RequestObservationMiddleware:
    """See the module docstring; `tracing` is None when tracing is off."""

    app: ASGIApp
    _: KW_ONLY
    metrics: ServiceMetrics
    tracing: Tracing | None
    access: bool
    # (route, method, status) -> its counter and histogram: looked up once, not per request.
    _series: dict[tuple[str, str, str], tuple[Any, Any]] = field(default_factory=dict, init=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
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
        status = 500  # if the app raises before answering, the server sends a 500
        body_times: list[float] = []
        tracing, token = self.tracing, None
        if tracing is not None:
            attributes = {
                "http.request.method": method,
                "url.path": scope["path"],
                "gmlp.request_id": request.request_id,
            }
            token = tracing.start_server_span(request, method, carrier, attributes)

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
                headers = [*message.get("headers", ()), (_REQUEST_ID, request_id)]
                message = {**message, "headers": headers}
            await send(message)

        self.metrics.in_flight.inc()
        with request_context.open_request(request):
            try:
                traced = tracing is not None and request.span.is_recording()
                await self.app(scope, timed_receive if traced else receive, observed_send)
            finally:
                self.metrics.in_flight.dec()
                route = getattr(scope.get("route"), "path", None) or "<unmatched>"
                request.route = route
                self._count(route, method, status, time.perf_counter() - start)
                if tracing is not None:
                    if len(body_times) == 2 and request.span.is_recording():
                        to_ns = epoch_ns()
                        body = to_ns(body_times[0]), to_ns(body_times[1])
                        tracing.span_between("read body", request.span, *body)
                    request.span.update_name(f"{method} {route}")
                    attributes = {"http.route": route, "http.response.status_code": status}
                    tracing.end_server_span(request, token, str(status), attributes, failed=status >= 500)
                if self.access:
                    self._log(scope, request, status)

    def _count(self, route: str, method: str, status: int, duration_s: float) -> None:
        labels = (route, method, str(status))
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = (
                self.metrics.requests.labels(*labels),
                self.metrics.latency.labels(*labels),
            )
        series[0].inc()
        series[1].observe(duration_s)

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
