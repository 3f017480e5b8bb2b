"""The HTTP routes, declared once: each with its endpoint, its key scope and its API's error table,
and the one table (`RouteTable`) that finds the route a request is for.

Every endpoint reads its own request (`service.http.parsing`) and returns its own Response
(`DirectRoute`): FastAPI's per-request machinery (dependency solving, parameter validation,
response serialisation) would only add event-loop work, while the OpenAPI document still describes
it as any APIRoute. A table built over a route that declares no scope stops the app. The request
gate (`service.http.gate`) asks the table once per request, in the router's order, so no form of a
path reaches one route under another's scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, ClassVar, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, Match
from starlette.types import Receive

from service.access.keys import KeyStore
from service.access.scope import Scope
from service.engine.request_context import Deadline, Timings, encode_off_loop
from service.http.errors import REST_ERRORS, ErrorTable, client_gone
from service.lifecycle.state import ServiceState

# The attribute on an endpoint function (or a route object) that holds its declared scope.
SCOPE_ATTRIBUTE = "gmlp_required_scope"
UNMATCHED_SCOPE = Scope.INFER  # paths no route takes: with keys, they are not probed without one
# Distinct (method, path) lookups remembered (paths up to CACHED_PATH_LENGTH characters, so the
# cache stays small whatever clients send); requests mostly repeat a few paths.
CACHE_SIZE = 4096
CACHED_PATH_LENGTH = 256

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def requires(scope: Scope | None) -> Callable[[F], F]:
    """Decorator (below the route decorator): the endpoint needs a key of `scope`; None: open. Also
    declares the scope of a route whose endpoint is not ours (a mount, FastAPI's own routes)."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, SCOPE_ATTRIBUTE, scope)
        return endpoint

    return mark


public = requires(None)


def declared_scope(route: BaseRoute) -> Scope | None:
    """The scope declared on `route` or on its endpoint; TypeError (the app stops) when there is none."""
    for holder in (route, getattr(route, "endpoint", None)):
        if holder is not None and hasattr(holder, SCOPE_ATTRIBUTE):
            return getattr(holder, SCOPE_ATTRIBUTE)
    raise TypeError(f"route {getattr(route, 'path', route)!r} declares no scope (service.http.routing)")


class DirectRoute(APIRoute):
    """A route whose endpoint takes the Request (and the route's path parameters) and returns a
    Response, with the error table of its API (a router declares it with
    `APIRouter(route_class=DirectRoute.answering(TABLE))`). Anything FastAPI would have to inject
    is refused when the route is declared; the gate calls the endpoint itself.
    """

    errors: ClassVar[ErrorTable] = REST_ERRORS

    @classmethod
    def answering(cls, errors: ErrorTable) -> type[DirectRoute]:
        """The direct route class whose refusals are rendered with `errors`."""
        return type(f"{cls.__name__}_{errors.transport}", (cls,), {"errors": errors})

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        dependant = self.dependant
        injected = ("query_params", "header_params", "cookie_params", "body_params", "dependencies")
        if any(getattr(dependant, kind) for kind in injected) or dependant.request_param_name is None:
            raise TypeError(f"{self.path}: a direct endpoint takes the Request and path parameters only")
        return self.endpoint  # never run by FastAPI's router: the gate calls it with the path parameters


def error_namespaces(routers: Iterable[APIRouter]) -> dict[str, ErrorTable]:
    """The error table of each router that has a prefix, by prefix: how a path below it that none
    of its routes takes (an unknown v2 path) is answered."""
    return {
        router.prefix: router.route_class.errors
        for router in routers
        if router.prefix and issubclass(router.route_class, DirectRoute)
    }


def flat(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """`routes` in the router's order, each included router (FastAPI keeps those as one entry that
    holds the router) replaced by its own routes."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is None:
            yield route
        else:
            yield from flat(included.routes)


# A request's route, the scope it needs, and the scope entries of its full match (the endpoint and
# path parameters), None for a partial match or none.
Matched = tuple[BaseRoute | None, Scope | None, Mapping[str, Any] | None]


class RouteTable:
    """The app's routes in the router's order, each with its declared scope (checked now).

    `app_routes` is the app's own list, read again on each lookup the cache does not hold, so that
    a route added to the app after this (before it serves) is found too."""

    def __init__(self, app_routes: Sequence[BaseRoute]) -> None:
        self.app_routes = app_routes
        for route in flat(app_routes):
            declared_scope(route)
        self._lookup = lru_cache(maxsize=CACHE_SIZE)(self._find)

    def route(self, method: str, path: str) -> Matched:
        """The route the router takes for `method` and `path` (without the root path), the scope
        it needs and, when it takes them fully, what its match adds to the request's scope: the
        first route that matches fully, else the first whose path matches with another method
        (which answers 405); None and `UNMATCHED_SCOPE` when no route takes it."""
        if len(path) > CACHED_PATH_LENGTH:
            return self._find(method, path)
        return self._lookup(method, path)

    def _find(self, method: str, path: str) -> Matched:
        probe = {"type": "http", "method": method, "path": path, "root_path": ""}
        partial = None
        for route in flat(self.app_routes):
            match, child = route.matches(probe)
            if match == Match.FULL:
                return route, declared_scope(route), child
            if match == Match.PARTIAL and partial is None:
                partial = route
        return partial, UNMATCHED_SCOPE if partial is None else declared_scope(partial), None

    def operation_scopes(self) -> dict[tuple[str, str], Scope | None]:
        """The scope of each documented operation, by (path template, lower-case method)."""
        found: dict[tuple[str, str], Scope | None] = {}
        for route in flat(self.app_routes):
            path = getattr(route, "path_format", None)
            for method in getattr(route, "methods", None) or ():
                if path is not None:
                    found.setdefault((path, method.lower()), declared_scope(route))
        return found


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


def secure_openapi(app: FastAPI, keys: KeyStore, table: RouteTable) -> None:
    """Declare both ways of sending a key in the OpenAPI document, on every operation that needs
    one as the server is configured (with keys: all but the open ones, health among them; without:
    admin only), with the scope its route declares in `x-required-scope`."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {})["securitySchemes"] = SCHEMES
        declared = table.operation_scopes()
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if not isinstance(operation, dict):
                    continue
                needed = declared.get((path, method), UNMATCHED_SCOPE)
                if needed is None or needed in keys.open_scopes:
                    operation["security"] = []
                    continue
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
                operation["x-required-scope"] = str(needed)
                responses = operation.setdefault("responses", {})
                responses.update({status: r for status, r in REFUSALS.items() if status not in responses})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def get_state(request: Request) -> ServiceState:
    """The app's `ServiceState`."""
    return request.app.state.service


def model_response(body: BaseModel) -> JSONResponse:
    """A direct route's document, built as its response model and serialised as FastAPI would."""
    return JSONResponse(body.model_dump(mode="json"))


# A generous bound of one ranked entry's JSON: label or token text, score, id, sequence prefix.
ENTRY_BYTES = 256


async def json_answer(
    body: Any, predictions: list[Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """`body` as a JSON response with `headers`; encoded in a worker thread when `predictions`
    (ranked entries, or a list of them per [MASK]) make it big."""
    entries = sum(len(item) if isinstance(item, list) else 1 for item in predictions)
    return await encode_off_loop(lambda: JSONResponse(body, headers=headers), ENTRY_BYTES * entries)


def timing_headers(on: bool, timings: Timings, deadline: Deadline) -> dict[str, str] | None:
    """The task answer's `Server-Timing` (None where the `server_timing` setting is off): the queue
    wait and batch run its rows came back with, and the time since its route took it (its
    deadline's start), in milliseconds with a tenth, as browsers' developer tools show them."""
    if not on:
        return None
    ms = (timings.queue_s * 1000, timings.infer_s * 1000, (deadline.timeout_s - deadline.remaining()) * 1000)
    return {"server-timing": "queue;dur={:.1f}, infer;dur={:.1f}, total;dur={:.1f}".format(*ms)}


async def _wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client goes away; the body has been read, so the next message is the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it if the client disconnects first (ClientGone then).

    Cancelling the batcher submission withdraws the request from the queue, so the model never
    runs for a client that is gone (e.g. one that timed out on its side and retried). `work` runs
    in the caller's own task, which a watcher of the connection cancels: one task per request
    rather than two and a wait on both.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = finished = False

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        # `finished`: a callback already scheduled when `work` ended must not cancel what follows.
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            task.cancel()

    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise client_gone() from None
    finally:
        finished = True
        watcher.cancel()
