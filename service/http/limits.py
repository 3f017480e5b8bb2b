"""The body size limit, applied before a route reads the body (the request line and headers:
`service.http.head`)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http.asgi import HttpMiddleware
from service.http.errors import BODY_PENDING, ErrorResponder, payload_too_large


class BodyLimitMiddleware(HttpMiddleware):
    """413 for bodies over `max_bytes`, early from Content-Length and by counting what is read.

    The Content-Length check rejects honest clients before they upload; the count catches chunked
    uploads and lying headers, so no request can make us buffer more than the limit. (uvicorn's
    HTTP parser has read the headers by then: a reverse proxy's limit bounds that, if needed.)

    It also marks the request while its body is still arriving (`BODY_PENDING`): a deadline that
    passes then is the client's slowness, answered 408 with the connection closed, not 504.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, errors: ErrorResponder) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.errors = errors

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            response = self.errors.response(scope, payload_too_large(self.max_bytes))
            await response(scope, receive, send)
            return
        received = 0
        scope[BODY_PENDING] = b"transfer-encoding" in headers or (length is not None and int(length) > 0)

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise payload_too_large(self.max_bytes)
                if not message.get("more_body", False):
                    scope[BODY_PENDING] = False
            return message

        await self.app(scope, limited_receive, send)


__all__ = ["BodyLimitMiddleware"]
