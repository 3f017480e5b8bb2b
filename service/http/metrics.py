"""HTTP metrics: every request counted and timed by route template and final status.

A pure ASGI middleware (Starlette's BaseHTTPMiddleware would buffer responses and break disconnect
detection), labelled by the *route template*, never the raw path, so that a scanner hitting random
URLs cannot blow up the label cardinality. The series live in the app's `ServiceMetrics`.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http.asgi import HttpMiddleware
from service.telemetry.metrics import ServiceMetrics


class HttpMetricsMiddleware(HttpMiddleware):
    """Counts and times every HTTP request by route template and final status."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics
        # (route, method, status) -> its counter and histogram: looked up once, not per request.
        self._series: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500  # if the app raises before answering, uvicorn sends a 500
        self.metrics.in_flight.inc()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            labels = (template, scope["method"], str(status))
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = (
                    self.metrics.requests.labels(*labels),
                    self.metrics.latency.labels(*labels),
                )
            series[0].inc()
            series[1].observe(time.perf_counter() - start)


__all__ = ["HttpMetricsMiddleware"]
