"""Direct routes: endpoints that read their own request, declared and documented like any other,
and dispatched by method and path before FastAPI's router."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from contract.errors import ErrorCode, InvalidInput
from service.app import create_app
from service.http.direct import DirectRoute, error_namespaces
from service.http.dispatch import DirectDispatchMiddleware
from service.http.errors import REST_ERRORS, ErrorResponder, ErrorTable, error_handlers
from service.settings import ServiceSettings


def test_a_direct_route_refuses_parameters_fastapi_would_inject() -> None:
    router = APIRouter(route_class=DirectRoute)

    async def injected(request: Request, top_k: int = Query(5)) -> JSONResponse:
        return JSONResponse({})

    async def no_request(name: str) -> JSONResponse:
        return JSONResponse({})

    with pytest.raises(TypeError, match="Request and path parameters only"):
        router.add_api_route("/a", injected, methods=["POST"])
    with pytest.raises(TypeError, match="Request and path parameters only"):
        router.add_api_route("/b/{name}", no_request, methods=["GET"])

    async def with_path(request: Request, name: str) -> JSONResponse:
        return JSONResponse({"name": name})

    router.add_api_route("/c/{name}", with_path, methods=["GET"])  # path parameters are fine
    app = FastAPI()
    app.include_router(router)
    assert "/c/{name}" in app.openapi()["paths"]


def test_classify_documents_its_query_as_before(tmp_path: object) -> None:
    """The query schema a client generator reads: the same names, types, bounds and defaults."""
    app = create_app(ServiceSettings(model_repository=str(tmp_path), checkpoint_dir=""))
    params = {p["name"]: p for p in app.openapi()["paths"]["/classify"]["post"]["parameters"]}
    assert params["top_k"]["in"] == "query" and not params["top_k"]["required"]
    assert params["top_k"]["schema"]["type"] == "integer" and params["top_k"]["schema"]["minimum"] == 1
    assert params["top_k"]["schema"]["default"] == 5
    assert {s.get("type") for s in params["model"]["schema"]["anyOf"]} == {"string", "null"}


def _dispatching() -> tuple[DirectDispatchMiddleware, list[str]]:
    """Direct routes (one templated, a static one it shadows, two that raise) and an ordinary one,
    dispatched in front of a stand-in for FastAPI's router that records what reaches it."""
    router = APIRouter(route_class=DirectRoute)

    async def item(request: Request, name: str) -> JSONResponse:
        return JSONResponse({"name": name, "route": request.scope["route"].path})

    async def special(request: Request) -> JSONResponse:
        return JSONResponse({"name": "never: the template above matches first"})

    async def refused(request: Request) -> JSONResponse:
        raise InvalidInput(ErrorCode.INVALID_PARAMETER, "the thing is bad; send a good one")

    async def broken(request: Request) -> JSONResponse:
        raise RuntimeError("a bug")

    router.add_api_route("/items/{name}", item, methods=["GET"])
    router.add_api_route("/items/special", special, methods=["GET"])
    router.add_api_route("/refused", refused, methods=["POST"])
    router.add_api_route("/broken", broken, methods=["POST"])
    router.routes.append(APIRoute("/plain", lambda: {"plain": True}, methods=["GET"]))
    reached: list[str] = []

    async def fastapi_router(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(f"{scope['method']} {scope['path']}")
        await JSONResponse({"by": "router"}, status_code=404)(scope, receive, send)

    handlers = error_handlers(ErrorResponder())
    return DirectDispatchMiddleware(fastapi_router, router.routes, handlers), reached


def test_direct_routes_are_answered_without_fastapis_router() -> None:
    app, reached = _dispatching()

    async def exchange() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            return [
                await client.get("/items/a%20b"),
                await client.get("/items/special"),
                await client.post("/refused"),
            ]

    item, shadowed, refused = asyncio.run(exchange())
    assert item.json() == {"name": "a b", "route": "/items/{name}"}
    assert shadowed.json() == {"name": "special", "route": "/items/{name}"}
    assert refused.status_code == 422
    assert refused.json() == {
        "error": {"code": "invalid_parameter", "message": "the thing is bad; send a good one"}
    }
    assert reached == []


def test_what_dispatch_does_not_match_goes_to_fastapis_router() -> None:
    app, reached = _dispatching()

    async def exchange() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            assert (await client.get("/plain")).json() == {"by": "router"}  # not a direct route
            assert (await client.post("/items/a")).json() == {"by": "router"}  # wrong method
            assert (await client.get("/no/such/path")).json() == {"by": "router"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            with pytest.raises(RuntimeError, match="a bug"):  # left to the unexpected-error middleware
                await client.post("/broken")

    asyncio.run(exchange())
    assert reached == ["GET /plain", "POST /items/a", "GET /no/such/path"]


def test_dispatch_matches_below_the_root_path_as_the_router_does() -> None:
    """Behind a proxy that strips a prefix, uvicorn's --root-path is prefixed to each path."""
    app, reached = _dispatching()

    async def exchange() -> list[httpx.Response]:
        mounted = httpx.ASGITransport(app, root_path="/api")
        async with httpx.AsyncClient(transport=mounted, base_url="http://test") as client:
            return [await client.get(path) for path in ("/api/items/a", "/api", "/apiitems/a", "/items/a")]

    item, root, other, as_sent = asyncio.run(exchange())
    assert item.json() == {"name": "a", "route": "/items/{name}"}
    assert root.json() == other.json() == {"by": "router"}
    assert reached == ["GET /api", "GET /apiitems/a"]
    assert as_sent.json() == {"name": "a", "route": "/items/{name}"}  # not below the root path: as sent


def test_the_error_shape_follows_the_route_not_the_path() -> None:
    """A REST route below another API's prefix keeps the REST shape; that API's routes, and paths
    below its prefix that no route takes, get its own, before routing (the size limits) too."""
    other_api = ErrorTable(REST_ERRORS.statuses, body=lambda error: {"error": error.message}, transport="x")
    rest, other = (
        APIRouter(route_class=DirectRoute),
        APIRouter(prefix="/models", route_class=DirectRoute.answering(other_api)),
    )

    async def refused(request: Request, name: str) -> JSONResponse:
        raise InvalidInput(ErrorCode.INVALID_PARAMETER, "the thing is bad; send a good one")

    rest.add_api_route("/models/{name}/card", refused, methods=["GET"])
    other.add_api_route("/{name}", refused, methods=["POST"])
    routes = [*rest.routes, *other.routes]
    responder = ErrorResponder(routes=routes, namespaces=error_namespaces([rest, other]))

    async def no_router(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("every request here is for a direct route")

    app = DirectDispatchMiddleware(no_router, routes, error_handlers(responder))

    async def exchange() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            return [await client.get("/models/a/card"), await client.post("/models/a")]

    card, model = asyncio.run(exchange())
    assert card.status_code == model.status_code == 422
    assert card.json() == {
        "error": {"code": "invalid_parameter", "message": "the thing is bad; send a good one"}
    }
    assert model.json() == {"error": "the thing is bad; send a good one"}

    def before_routing(method: str, path: str, root_path: str = "") -> ErrorTable:
        return responder.table({"type": "http", "method": method, "path": path, "root_path": root_path})

    assert before_routing("GET", "/models/a/card") is REST_ERRORS
    assert before_routing("POST", "/models/a") is before_routing("GET", "/models/a") is other_api
    assert before_routing("GET", "/models/a/b/c") is other_api  # below the prefix, no route
    assert before_routing("GET", "/modelsx") is before_routing("GET", "/elsewhere") is REST_ERRORS
    # Behind a proxy's root path, as the router matches: the route below it.
    assert before_routing("POST", "/api/models/a", root_path="/api") is other_api
    assert before_routing("GET", "/api/models/a/card", root_path="/api") is REST_ERRORS
