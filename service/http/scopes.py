"""Which key scope each HTTP route needs, declared where the route is declared, and the route a
request will reach, found as the router finds it.

Every endpoint says what it needs beside its path: `@requires(Scope.INFER)` (or `METRICS`,
`ADMIN`), or `@public` for the open ones (health probes, the pages, the API documents). Routes the
service does not declare itself (FastAPI's OpenAPI document, the static mounts) get theirs with
`declare`. Nothing keeps a second table of paths: the access middleware asks `RouteIndex`, which
matches the request against the app's own routes, in the router's order and with the routes' own
`matches` (the same regexes, methods and mounts the router uses), and reads the scope of the route
that will answer. A path form cannot reach one route under another's scope, since the scope is the
answering route's. An index built over an undeclared route fails when the app is built.

Paths no route takes need `INFER` (with keys, unknown paths are not probed without one). Paths with
a control character (`/metrics%0A`: the routers' patterns end in `$`, which also matches before a
final newline) are refused before routing (`service.http.head`), so no route answers them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from starlette.routing import BaseRoute, Match

from service.access.scope import Scope

# The attribute on an endpoint function (or a route object) that holds its declared scope.
SCOPE_ATTRIBUTE = "gmlp_required_scope"
UNMATCHED_SCOPE = Scope.INFER
# Distinct (method, path) lookups remembered (paths up to CACHED_PATH_LENGTH characters, so the
# cache stays small whatever clients send); requests mostly repeat a few paths.
CACHE_SIZE = 4096
CACHED_PATH_LENGTH = 256

F = TypeVar("F", bound=Callable[..., Any])


class UndeclaredScope(TypeError):
    """A route was added without a declared scope: the app refuses to start."""


def requires(scope: Scope | None) -> Callable[[F], F]:
    """Decorator (below the route decorator): the endpoint needs a key of `scope`; None: open."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, SCOPE_ATTRIBUTE, scope)
        return endpoint

    return mark


public = requires(None)


def declare(route: BaseRoute, scope: Scope | None) -> None:
    """Declare the scope of a route whose endpoint is not ours (a mount, FastAPI's own routes)."""
    setattr(route, SCOPE_ATTRIBUTE, scope)


def declared_scope(route: BaseRoute) -> Scope | None:
    """The scope declared on `route` or on its endpoint; `UndeclaredScope` when there is none."""
    for holder in (route, getattr(route, "endpoint", None)):
        if holder is not None and hasattr(holder, SCOPE_ATTRIBUTE):
            return getattr(holder, SCOPE_ATTRIBUTE)
    raise UndeclaredScope(f"route {getattr(route, 'path', route)!r} declares no scope (service.http.scopes)")


class RouteIndex:
    """The app's routes in the router's order, each with its declared scope (checked now)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.routes = tuple(routes)
        self.scopes = {id(route): declared_scope(route) for route in self.routes}
        self._lookup = lru_cache(maxsize=CACHE_SIZE)(self._find)

    def route(self, method: str, path: str) -> BaseRoute | None:
        """The route the router takes for `method` and `path` (without the root path): the first that
        matches fully, else the first whose path matches with another method (which answers 405)."""
        if len(path) > CACHED_PATH_LENGTH:
            return self._find(method, path)
        return self._lookup(method, path)

    def scope(self, method: str, path: str) -> Scope | None:
        """The scope the request needs: its route's, or `UNMATCHED_SCOPE` when no route takes it."""
        route = self.route(method, path)
        return UNMATCHED_SCOPE if route is None else self.scopes[id(route)]

    def _find(self, method: str, path: str) -> BaseRoute | None:
        probe = {"type": "http", "method": method, "path": path, "root_path": ""}
        partial = None
        for route in self.routes:
            match, _ = route.matches(probe)
            if match == Match.FULL:
                return route
            if match == Match.PARTIAL and partial is None:
                partial = route
        return partial

    def operation_scopes(self) -> dict[tuple[str, str], Scope | None]:
        """The scope of each documented operation, by (path template, lower-case method): what the
        OpenAPI document annotates."""
        found: dict[tuple[str, str], Scope | None] = {}
        for route in self.routes:
            path = getattr(route, "path_format", None)
            for method in getattr(route, "methods", None) or ():
                if path is not None:
                    found.setdefault((path, method.lower()), self.scopes[id(route)])
        return found


__all__ = [
    "RouteIndex",
    "requires",
    "public",
    "declare",
    "declared_scope",
    "UndeclaredScope",
    "UNMATCHED_SCOPE",
    "SCOPE_ATTRIBUTE",
]
