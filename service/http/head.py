"""The request head, checked before access control and routing: its size, its Host header, and
the form of its path.

- 431 `headers_too_large`: the request line (path and query string) plus the headers over
  `max_header_bytes`;
- 400 `bad_request`: an HTTP/1.1 request without exactly one Host header (RFC 9112, section 3.2;
  HTTP/1.0 needs none);
- 404 `not_found`: a path with a control character once decoded (`%0A`, `%0D`, `%00`...). The
  routes' patterns end in `$`, which also matches before a final newline, so without this every
  route would answer its path plus `%0A`; no route takes such a path, whatever its scope.

Each refusal takes the shape of the API the path belongs to (`ErrorResponder`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from contract.errors import (
    ErrorCode,
    HeadersTooLarge,
    MalformedRequest,
    RequestError,
    RouteNotFound,
)
from contract.messages import CONTROL_CHARACTERS
from service.http.asgi import HttpMiddleware
from service.http.errors import ErrorResponder

# The bytes a request line adds besides its target: "GET " + " HTTP/1.1\r\n".
_LINE_OVERHEAD = 16


def head_bytes(scope: Scope) -> int:
    """The size of the request line (path, `?` and query string) and the headers, as sent."""
    query = scope.get("query_string") or b""
    target = len(scope.get("raw_path") or scope["path"].encode()) + (len(query) + 1 if query else 0)
    return _LINE_OVERHEAD + target + sum(len(k) + len(v) + 4 for k, v in scope["headers"])


def head_error(scope: Scope, max_header_bytes: int) -> RequestError | None:
    """Why the request head is refused, or None when it is fine."""
    size = head_bytes(scope)
    if size > max_header_bytes:
        return HeadersTooLarge(
            ErrorCode.HEADERS_TOO_LARGE,
            f"the request line and headers are {size} bytes; at most {max_header_bytes} are accepted",
        )
    if scope.get("http_version") == "1.1":
        hosts = sum(1 for name, _ in scope["headers"] if name == b"host")
        if hosts != 1:
            return MalformedRequest(
                ErrorCode.BAD_REQUEST,
                f"an HTTP/1.1 request needs exactly one Host header; this one has {hosts}",
            )
    if CONTROL_CHARACTERS.search(scope["path"]):
        return RouteNotFound(
            ErrorCode.NOT_FOUND, "no endpoint has this path: a path may not hold control characters"
        )
    return None


class RequestHeadMiddleware(HttpMiddleware):
    """Refuses a request whose head `head_error` refuses, before anything else of ours reads it."""

    def __init__(self, app: ASGIApp, errors: ErrorResponder, max_header_bytes: int) -> None:
        super().__init__(app)
        self.errors = errors
        self.max_header_bytes = max_header_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = head_error(scope, self.max_header_bytes)
        if error is None:
            await self.app(scope, receive, send)
            return
        await self.errors.response(scope, error)(scope, receive, send)


__all__ = ["RequestHeadMiddleware", "head_error", "head_bytes"]
