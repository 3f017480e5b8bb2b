"""Direct routes: endpoints that read their own request, declared and documented like any other."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from service.app import create_app
from service.http_io import DirectRoute
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
