"""The base of the service's pure ASGI middlewares.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which buffers responses and breaks
disconnect detection; each middleware sees HTTP requests only, anything else (the lifespan) passes
straight through.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """Calls `handle` for each HTTP request; other scopes go to the wrapped app untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


__all__ = ["HttpMiddleware"]
