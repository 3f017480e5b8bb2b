"""API keys over HTTP: the access middleware and the OpenAPI security schemes.

The key comes as `Authorization: Bearer KEY` (what huggingface_hub's `token=` and most clients
send) or as `x-api-key: KEY` (for clients that cannot set Authorization). `AccessMiddleware`
decides before anything reads the body, so a refused request never reaches a route, a decoder
or a batch: 401 with `WWW-Authenticate: Bearer` without a valid key, 403 when the key lacks the
scope, 429 with `Retry-After` over the key's rate, each in the shape of the API the path belongs
to. The scope is the one declared on the route that will answer (`service.http.scopes`): the
request is matched against the app's routes as the router matches it, so no form of a path reaches
a route under another route's scope.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette._utils import get_route_path  # the router's own rule, as FastAPI's router uses it
from starlette.types import ASGIApp, Receive, Scope, Send

from contract.errors import PermissionDenied, RateLimited, Unauthenticated
from service.access.keys import KeyStore, presented_key
from service.access.scope import Scope as KeyScope
from service.http.asgi import HttpMiddleware
from service.http.errors import ErrorResponder
from service.http.scopes import UNMATCHED_SCOPE, RouteIndex

# The key's name, for whatever comes after (logs, metrics): scope["state"] is per request.
KEY_NAME = "gmlp.key_name"


def credential(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key a request presents (`presented_key`), from its headers."""
    return presented_key(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name in (b"authorization", b"x-api-key")
    )


class AccessMiddleware(HttpMiddleware):
    """Refuses requests without the key their route needs (`index`), before any route runs."""

    def __init__(self, app: ASGIApp, keys: KeyStore, errors: ErrorResponder, index: RouteIndex) -> None:
        super().__init__(app)
        self.keys = keys
        self.errors = errors
        self.index = index

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        needed = self.index.scope(scope["method"], get_route_path(scope))
        if needed is None:
            await self.app(scope, receive, send)
            return
        try:
            name = self.keys.authorize(credential(scope["headers"]), needed, "http")
        except (Unauthenticated, PermissionDenied, RateLimited) as exc:
            await self.errors.response(scope, exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[KEY_NAME] = name
        await self.app(scope, receive, send)


SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "x-api-key: KEY"},
}

# The refusals of access control, documented on every operation that needs a key (in the shape of
# the operation's API: an object with `error`).
_REFUSAL = {"application/json": {"schema": {"type": "object", "required": ["error"]}}}
REFUSALS = {
    "401": {"description": "no valid API key (`WWW-Authenticate: Bearer`)", "content": _REFUSAL},
    "403": {
        "description": "the key lacks the operation's scope, or admin routes are closed",
        "content": _REFUSAL,
    },
    "429": {"description": "the key's rate is used up; retry after `Retry-After`", "content": _REFUSAL},
}


def secure_openapi(app: FastAPI, keys: KeyStore, index: RouteIndex) -> None:
    """Declare both ways of sending a key in the OpenAPI document, on every operation that needs
    one as the server is configured (with keys: all but the open ones, health among them; without:
    admin only), with the scope its route declares (`index`) in `x-required-scope`."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {})["securitySchemes"] = SCHEMES
        declared = index.operation_scopes()
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if not isinstance(operation, dict):
                    continue
                needed = declared.get((path, method), UNMATCHED_SCOPE)
                if not keys.enabled and needed is not KeyScope.ADMIN:
                    needed = None
                operation["security"] = [] if needed is None else [{"bearer": []}, {"apiKey": []}]
                if needed is not None:
                    operation["x-required-scope"] = str(needed)
                    responses = operation.setdefault("responses", {})
                    for status, response in REFUSALS.items():
                        responses.setdefault(status, response)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["AccessMiddleware", "credential", "secure_openapi", "KEY_NAME"]
