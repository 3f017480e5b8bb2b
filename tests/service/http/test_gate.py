"""The request gate and its route table: direct routes (endpoints that read their own request,
declared and documented like any other) and every other route answered after one match, each
refusal in the shape of the route's API, every exception through one path."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from contract.errors import ErrorCode, InvalidInput
from service.access.keys import KeyStore
from service.app import create_app
from service.http.errors import REST_ERRORS, ErrorResponder, ErrorTable
from service.http.gate import RequestGate
from service.http.hosts import HostRule
from service.http.routing import DirectRoute, RouteTable, error_namespaces, public
from service.settings import ServiceSettings
from service.telemetry.metrics import ServiceMetrics


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


def _gate(routes: list[BaseRoute], responder: ErrorResponder | None = None) -> RequestGate:
    """The request gate over `routes` (no keys, generous limits), in front of an app that only the
    lifespan may reach."""

    async def fastapi_router(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["path"] == "/plain", f"the gate let {scope['path']} through"
        await JSONResponse({"by": "router"})(scope, receive, send)

    for route in routes:
        public(route)
    return RequestGate(
        fastapi_router,
        table=RouteTable(routes),
        errors=responder or ErrorResponder(),
        keys=KeyStore(None, ServiceMetrics(1)),
        max_header_bytes=8192,
        max_body_bytes=1024,
        hosts=HostRule.from_setting(None, keyed=False),
    )


def _routes() -> list[BaseRoute]:
    """Direct routes (one templated, a static one it shadows, two that raise) and an ordinary one."""
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
    return [*router.routes, APIRoute("/plain", lambda: {"plain": True}, methods=["GET"])]


def _exchange(app: RequestGate, *requests: tuple[str, str], root_path: str = "") -> list[httpx.Response]:
    async def exchange() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return [await client.request(method, path) for method, path in requests]

    return asyncio.run(exchange())


def test_the_gate_answers_every_route_itself() -> None:
    item, shadowed, refused, plain = _exchange(
        _gate(_routes()),
        ("GET", "/items/a%20b"),
        ("GET", "/items/special"),
        ("POST", "/refused"),
        ("GET", "/plain"),
    )
    assert item.json() == {"name": "a b", "route": "/items/{name}"}
    assert shadowed.json() == {"name": "special", "route": "/items/{name}"}
    assert refused.status_code == 422
    assert refused.json() == {
        "error": {"code": "invalid_parameter", "message": "the thing is bad; send a good one"}
    }
    assert plain.json() == {"by": "router"}  # FastAPI's injection: FastAPI's router


def test_wrong_methods_unknown_paths_and_bugs_take_the_one_exception_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        wrong, unknown, broken = _exchange(
            _gate(_routes()), ("POST", "/items/a"), ("GET", "/no/such/path"), ("POST", "/broken")
        )
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    assert broken.status_code == 500 and broken.json()["error"]["code"] == "internal_error"
    assert "a bug" not in broken.text
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["unhandled error on POST /broken"]


def test_the_gate_matches_below_the_root_path_as_the_router_does() -> None:
    """Behind a proxy that strips a prefix, uvicorn's --root-path is prefixed to each path."""
    item, root, other, as_sent = _exchange(
        _gate(_routes()),
        *[("GET", path) for path in ("/api/items/a", "/api", "/apiitems/a", "/items/a")],
        root_path="/api",
    )
    assert item.json() == {"name": "a", "route": "/items/{name}"}
    assert root.status_code == other.status_code == 404
    assert as_sent.json() == {"name": "a", "route": "/items/{name}"}  # not below the root path: as sent


def test_the_error_shape_follows_the_route_not_the_path() -> None:
    """A REST route below another API's prefix keeps the REST shape; that API's routes, and paths
    below its prefix that no route takes, get its own, before the route runs (the size limits) too."""
    other_api = ErrorTable(REST_ERRORS.statuses, body=lambda error: {"error": error.message}, transport="x")
    rest, other = (
        APIRouter(route_class=DirectRoute),
        APIRouter(prefix="/models", route_class=DirectRoute.answering(other_api)),
    )

    async def refused(request: Request, name: str) -> JSONResponse:
        raise InvalidInput(ErrorCode.INVALID_PARAMETER, "the thing is bad; send a good one")

    rest.add_api_route("/models/{name}/card", refused, methods=["GET"])
    other.add_api_route("/{name}", refused, methods=["POST"])
    responder = ErrorResponder(namespaces=error_namespaces([rest, other]))
    app = _gate([*rest.routes, *other.routes], responder)
    card, model, unknown, too_big, elsewhere = _exchange(
        app,
        ("GET", "/models/a/card"),
        ("POST", "/models/a"),
        ("GET", "/models/a/b/c"),  # below the prefix, no route
        ("GET", "/models/a/card?" + "q" * 9000),
        ("GET", "/modelsx"),
    )
    assert card.status_code == model.status_code == 422
    assert card.json() == {
        "error": {"code": "invalid_parameter", "message": "the thing is bad; send a good one"}
    }
    assert model.json() == {"error": "the thing is bad; send a good one"}
    assert unknown.status_code == 404 and unknown.json() == {"error": "Not Found"}
    assert too_big.status_code == 431 and too_big.json()["error"]["code"] == "headers_too_large"
    assert elsewhere.json()["error"]["code"] == "not_found"
    # Behind a proxy's root path, as the router matches: the route below it.
    below, rest_below = _exchange(
        app, ("POST", "/api/models/a"), ("GET", "/api/models/a/card"), root_path="/api"
    )
    assert below.json() == {"error": "the thing is bad; send a good one"}
    assert rest_below.json()["error"]["code"] == "invalid_parameter"
