"""The Hugging Face inference API: `POST /models/{name}`, as Inference Endpoints serve it.

`huggingface_hub.InferenceClient(model="http://HOST:PORT/models/NAME")` posts to that URL as given:
for fill-mask `{"inputs": "text with [MASK]", "parameters": {"top_k", "targets"}}`, for image
classification the raw image bytes (often without a content type), or `{"inputs": "<base64>",
"parameters": {"top_k", "function_to_apply"}}` once parameters are set. A raw body is the input
itself: a classifier's image, a masked LM's UTF-8 text (so that one operation accepts what its
schema documents for either kind of model). The answers are the
pipelines' own lists: `[{"label", "score"}]`, and `[{"score", "token", "token_str", "sequence"}]`
for one [MASK] (a list of such lists for several), which is what the client parses. Errors are
`{"error": "<message>"}` (the client shows that message) with the task routes' statuses.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from contract.errors import ErrorCode, InvalidInput, RequestError
from contract.image import ACCEPTED_DESCRIPTION
from service.access.scope import Scope
from service.engine.deadline import Deadline, before
from service.http.answers import json_answer
from service.http.disconnect import unless_disconnected
from service.http.errors import REST_ERRORS, ErrorTable
from service.http.parsing import (
    RAW_TYPES,
    decode_base64,
    json_body,
    media_type,
    unsupported_media_type,
    validated,
)
from service.http.routing import DirectRoute, get_state, requires
from service.http.schemas import (
    MAX_TARGETS,
    MAX_TEXT_LENGTH,
    LabelScore,
    MaskPrediction,
    MessageError,
    Target,
    TopK,
    error_responses,
    inline_schema,
)
from service.tasks.pipeline import FillMaskPipeline, Pipeline, VisionPipeline


def hf_body(error: RequestError) -> dict[str, Any]:
    return {"error": error.message}


HF_ERRORS = ErrorTable(statuses=REST_ERRORS.statuses, body=hf_body, transport="hf")
# The API's routes and any other path below its prefix answer in its error shape; GET /models (the
# task API's listing) is a route of its own and keeps the REST shape.
PREFIX = "/models"
router = APIRouter(
    prefix=PREFIX, tags=["Hugging Face inference API"], route_class=DirectRoute.answering(HF_ERRORS)
)


class HFParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: TopK | None = Field(None, description="results (per [MASK]); classifiers cap it at their labels")
    targets: list[Target] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TARGETS,
        description="fill-mask: restrict the candidates to these words",
    )
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None, description="image classification: how logits become scores (default softmax)"
    )


class HFRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"inputs": "paris is the [MASK] of france.", "parameters": {"top_k": 3}}]
        },
    )
    inputs: str = Field(
        min_length=1,
        max_length=MAX_TEXT_LENGTH,
        description="fill-mask: the text with [MASK]; image classification: the image file, base64",
    )
    parameters: HFParameters | None = None


_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": f"JSON, or the raw input: an image classifier's image ({ACCEPTED_DESCRIPTION}), a "
        "masked LM's UTF-8 text; with any image/* or text/* type, application/octet-stream or none",
        "content": {
            "application/json": {"schema": inline_schema(HFRequest)},
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "text/plain": {"schema": {"type": "string"}},
        },
    }
}
HFResponse = list[LabelScore] | list[MaskPrediction] | list[list[MaskPrediction]]


async def _read(request: Request, served: Pipeline) -> tuple[HFRequest | None, bytes]:
    """The JSON request; else the raw body: a classifier's image, a masked LM's UTF-8 text."""
    mime = media_type(request)
    if mime == "application/json" or mime.endswith("+json"):
        return json_body(await request.body(), HFRequest, "the JSON body"), b""
    if mime not in RAW_TYPES and not mime.startswith(("image/", "text/")):
        raise unsupported_media_type(mime, 'send JSON {"inputs": ..., "parameters": {...}} or the raw input')
    data = await request.body()
    if not data:
        raise InvalidInput(ErrorCode.EMPTY_BODY, "the body is empty; send the image or the text")
    if isinstance(served, FillMaskPipeline):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(ErrorCode.INVALID_TEXT, "a raw text body must be UTF-8") from None
        return validated(HFRequest, {"inputs": text}, "the JSON body"), b""
    return None, data


async def _run(served: Pipeline, body: HFRequest | None, image: bytes, deadline: Deadline) -> Any:
    params = (body.parameters if body else None) or HFParameters()
    if isinstance(served, FillMaskPipeline):
        assert body is not None
        if params.function_to_apply is not None:
            raise InvalidInput(
                ErrorCode.INVALID_PARAMETER, "function_to_apply applies to image classification only"
            )
        predictions = await served.fill_mask(body.inputs, params.top_k or 5, params.targets, deadline)
        return predictions[0] if len(predictions) == 1 else predictions
    if not isinstance(served, VisionPipeline):  # pragma: no cover - every task is one of the two
        raise InvalidInput(ErrorCode.WRONG_TASK, f"model {served.name} serves no task of this API")
    if params.targets is not None:
        raise InvalidInput(ErrorCode.INVALID_PARAMETER, "targets apply to fill-mask only")
    if body is not None:
        image = decode_base64(body.inputs, "inputs")
    top_k = min(params.top_k or 5, len(served.labels))  # as HF's pipeline does: at most every label
    return await served.classify(image, top_k, deadline, params.function_to_apply or "softmax")


@router.post(
    "/{name}",
    response_model=HFResponse,
    responses=error_responses(MessageError),
    openapi_extra=_BODY,
    summary="Hugging Face inference API (fill-mask, image classification)",
)
@requires(Scope.INFER)
async def hf_inference(request: Request, name: str) -> JSONResponse:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    with state.serving(name, Pipeline) as served:  # either task; held until the answer is back
        body, image = await before(_read(request, served), deadline)
        answer = await unless_disconnected(request, _run(served, body, image, deadline))
    return await json_answer(answer, answer)


__all__ = ["router", "HF_ERRORS", "PREFIX", "HFRequest"]
