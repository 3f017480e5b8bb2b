"""The HTTP API: task endpoints, health, model listing and metrics.

Routes stay thin: resolve the model, read the payload, call the pipeline while watching for the
client to go away, shape the response. Every request has a deadline from its arrival.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from contract.image import ACCEPTED_DESCRIPTION
from service.access.scope import Scope
from service.engine.request_context import Deadline, before
from service.http.parsing import (
    ClassifyJSONRequest,
    ClassifyQuery,
    FillMaskRequest,
    query_parameters,
    read_image,
    read_json,
    read_query,
)
from service.http.routing import (
    DirectRoute,
    get_state,
    json_answer,
    model_response,
    public,
    requires,
    timing_headers,
    unless_disconnected,
)
from service.http.schemas import (
    ERROR_RESPONSES,
    ClassifyResponse,
    FillMaskResponse,
    HealthResponse,
    ModelInfo,
    ModelsResponse,
    VersionState,
)
from service.lifecycle.state import Phase
from service.tasks.fill_mask import FillMaskPipeline
from service.tasks.vision import VisionPipeline

# Every endpoint here reads its own request and builds its own response (DirectRoute); refusals
# take the REST error shape (REST_ERRORS, DirectRoute's own table).
router = APIRouter(route_class=DirectRoute)

_CLASSIFY_BODY: dict[str, Any] = {
    "parameters": query_parameters(ClassifyQuery),
    "requestBody": {
        "required": True,
        "description": f"the image ({ACCEPTED_DESCRIPTION}) as multipart field `file`, as the raw body "
        "(image/*, application/octet-stream or no content type: the format is read from the bytes), "
        "or base64 in JSON",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": ClassifyJSONRequest.model_json_schema()},
        },
    },
}
_FILL_MASK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": FillMaskRequest.model_json_schema()}},
    }
}


def _task(path: str, response_model: type[BaseModel], body: dict[str, Any], summary: str) -> Any:
    """The route decorator of a task endpoint (the INFER scope, the REST refusals)."""
    route = router.post(
        path,
        response_model=response_model,
        responses=ERROR_RESPONSES,
        openapi_extra=body,
        summary=summary,
        tags=["tasks"],
    )
    return lambda endpoint: route(requires(Scope.INFER)(endpoint))


@_task("/classify", ClassifyResponse, _CLASSIFY_BODY, "Classify an image")
async def classify(request: Request) -> JSONResponse:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    query = read_query(request, ClassifyQuery)
    with state.lease(query.model, None, kind=VisionPipeline) as served:  # held until the answer is back
        image = await before(read_image(request), deadline)
        answer = await unless_disconnected(request, served.classify(image, query.top_k, deadline))
    headers = timing_headers(state.settings.server_timing, answer.timings, deadline)
    return await json_answer({"model": served.name, "predictions": answer.value}, answer.value, headers)


@_task("/fill-mask", FillMaskResponse, _FILL_MASK_BODY, "Predict the [MASK] tokens of a text")
async def fill_mask(request: Request) -> JSONResponse:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    body = await before(read_json(request, FillMaskRequest), deadline)
    with state.lease(body.model, None, kind=FillMaskPipeline) as served:
        answer = await unless_disconnected(
            request, served.fill_mask(body.text, body.top_k, body.targets, deadline)
        )
    # Built by the pipelines in the documented schema (`response_model`, which tests check against
    # the OpenAPI document): serialised once, without validating it again.
    headers = timing_headers(state.settings.server_timing, answer.timings, deadline)
    return await json_answer({"model": served.name, "predictions": answer.value}, answer.value, headers)


def _health(ok: bool, status: str, detail: str | None = None) -> JSONResponse:
    body = HealthResponse(status=status, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=200 if ok else 503)


def _probe(path: str, summary: str) -> Any:
    """The route decorator of a health probe: 200 or 503, both with a `HealthResponse`."""
    unhealthy: dict[int | str, dict[str, Any]] = {
        503: {"model": HealthResponse, "description": "not live / not ready"}
    }
    return router.get(
        path, response_model=HealthResponse, responses=unhealthy, tags=["health"], summary=summary
    )


@_probe("/health/live", "Liveness probe")
@public
async def live(request: Request) -> JSONResponse:
    """200 while the process works; 503 only if loading the models failed (restart won't hurt)."""
    state = get_state(request)
    if state.phase is Phase.FAILED:
        return _health(False, "failed", state.error)
    return _health(True, "alive")


@_probe("/health/ready", "Readiness probe")
@public
async def ready(request: Request) -> JSONResponse:
    """200 only when every model is loaded and warmed up; 503 while loading, failed or draining."""
    state = get_state(request)
    if state.ready:
        # Versions that failed to load do not make the server unready (their predecessors serve):
        # the probe's body names them, as the repository index does.
        failed = [
            f"{e.name} {e.version}: {e.reason}" for e in state.index() if e.reason.startswith("load failed")
        ]
        return _health(True, "ready", "; ".join(failed) or None)
    return _health(False, state.phase, state.not_ready_error().message)


@router.get(
    "/models", response_model=ModelsResponse, tags=["models"], summary="Served models and their settings"
)
@requires(Scope.INFER)
async def list_models(request: Request) -> JSONResponse:
    state = get_state(request)
    models = [ModelInfo.model_validate(m.describe()) for m in state.newest_ready().values()]
    versions = [VersionState.model_validate(vars(entry)) for entry in state.index()]
    return model_response(ModelsResponse(models=models, defaults=state.defaults, versions=versions))


@router.get("/metrics", include_in_schema=False)
@requires(Scope.METRICS)
async def metrics(request: Request) -> Response:
    state = get_state(request)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
