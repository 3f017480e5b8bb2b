"""The model-repository extension over REST: `POST /v2/repository/index`, `.../models/{name}/load`
and `.../unload`, as tritonclient.http calls them (an empty body, or JSON; any content type).

The index lists every model version the service knows with its state (READY, LOADING, UNLOADING,
UNAVAILABLE) and, unless READY, the reason; load and unload are taken only in explicit model
control (`service.v2.inference.load_model`, `ServiceState.unload_model`, shared with gRPC).

Every path here is a control route: access control gives it the admin scope. Errors take the
protocol's shape and statuses (`V2_ERRORS`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, StrictBool

from service.access.scope import Scope
from service.http.parsing import json_body
from service.http.routing import DirectRoute, get_state, requires
from service.http.schemas import VersionState
from service.v2 import inference
from service.v2.rest import V2_ERRORS
from service.v2.schemas import ERROR_RESPONSES

PREFIX = "/v2/repository"

router = APIRouter(
    prefix=PREFIX,
    tags=["Open Inference Protocol v2: model repository"],
    route_class=DirectRoute.answering(V2_ERRORS),
)


class IndexRequest(BaseModel):
    ready: StrictBool = Field(False, description="true: only the READY versions")


class ControlRequest(BaseModel):
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description='load: {"config": "<JSON model configuration>"}; its version_policy picks the versions',
    )


async def _body(request: Request, schema: type[Any]) -> Any:
    raw = await request.body()
    if not raw.strip():
        return schema()
    return json_body(raw, schema, "the request body")


@router.post(
    "/index", response_model=list[VersionState], responses=ERROR_RESPONSES, summary="Repository index"
)
@requires(Scope.ADMIN)
async def repository_index(request: Request) -> JSONResponse:
    body = await _body(request, IndexRequest)
    return JSONResponse([vars(entry) for entry in get_state(request).table.index(body.ready)])


@router.post("/models/{name}/load", responses=ERROR_RESPONSES, summary="Load a model")
@requires(Scope.ADMIN)
async def load_model(request: Request, name: str) -> Response:
    body = await _body(request, ControlRequest)
    await inference.load_model(get_state(request), name, body.parameters)
    return Response(status_code=200)


@router.post("/models/{name}/unload", responses=ERROR_RESPONSES, summary="Unload a model")
@requires(Scope.ADMIN)
async def unload_model(request: Request, name: str) -> Response:
    await _body(request, ControlRequest)
    await get_state(request).unload_model(name)
    return Response(status_code=200)
