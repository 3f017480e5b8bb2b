"""Direct dispatch: a request for a direct route goes straight to its endpoint.

A request that FastAPI routes passes Starlette's exception middleware, FastAPI's exit-stack
middleware, a scan of every included router's routes, and a per-route wrapper that opens two exit
stacks and wraps `send` again for its exception handlers. A `DirectRoute` needs none of it: its
endpoint takes the Request and returns a Response, so the dispatch saves that work on every
request.

`DirectDispatchMiddleware`, the innermost of the service's middlewares, finds the direct route by
method and path, calls its endpoint, and renders what it raises with the handlers the app has
installed for the same exceptions, so an answer does not depend on which of the two served it.
Whatever it does not match (other routes, unknown paths, wrong methods) goes on to FastAPI's
router unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import Request
from starlette._utils import get_route_path  # the router's own rule, as FastAPI's router uses it
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from contract.errors import most_specific
from service.http.asgi import HttpMiddleware
from service.http.direct import DirectRoute
from service.http.errors import Handler


def _matches(route: DirectRoute, method: str, path: str) -> dict[str, Any] | None:
    """The converted path parameters when `route` takes this method and path, else None."""
    found = route.path_regex.match(path)
    if found is None or method not in (route.methods or ()):
        return None
    return {name: route.param_convertors[name].convert(value) for name, value in found.groupdict().items()}


class DirectDispatchMiddleware(HttpMiddleware):
    """Serves the `DirectRoute`s among `routes` (in FastAPI's order of precedence); `handlers` maps
    the exceptions an endpoint may raise to their error responses."""

    def __init__(
        self, app: ASGIApp, routes: Iterable[BaseRoute], handlers: Mapping[type[Exception], Handler]
    ) -> None:
        super().__init__(app)
        self.handlers = dict(handlers)
        # Paths without parameters by (method, path), one lookup; templated ones tried in order.
        # The router takes the first route that matches: a static path that an earlier template
        # also matches is served by that template, there as here.
        self.static: dict[tuple[str, str], DirectRoute] = {}
        self.templated: list[DirectRoute] = []
        for route in routes:
            if not isinstance(route, DirectRoute):
                continue
            if route.param_convertors:
                self.templated.append(route)
                continue
            for method in route.methods or ():
                if not any(_matches(earlier, method, route.path) is not None for earlier in self.templated):
                    self.static.setdefault((method, route.path), route)

    def match(self, method: str, path: str) -> tuple[DirectRoute, dict[str, Any]] | None:
        route = self.static.get((method, path))
        if route is not None:
            return route, {}
        for route in self.templated:
            params = _matches(route, method, path)
            if params is not None:
                return route, params
        return None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path as the router matches it: without a root path the ASGI server was given.
        found = self.match(scope["method"], get_route_path(scope))
        if found is None:
            await self.app(scope, receive, send)
            return
        route, params = found
        # What the router would have recorded: the route (the metrics' label) and its parameters.
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request, **params)
        except Exception as exc:
            handler = most_specific(self.handlers, type(exc), None)
            if handler is None:
                raise  # a bug: the unexpected-error middleware answers and logs it
            response = await handler(request, exc)
        await response(scope, receive, send)


__all__ = ["DirectDispatchMiddleware"]
