"""The Hugging Face inference API: `POST /models/{name}`, as Inference Endpoints serve it.

`huggingface_hub.InferenceClient(model="http://HOST:PORT/models/NAME")` posts to that URL as given:
for fill-mask `{"inputs": "text with [MASK]", "parameters": {"top_k", "targets"}}`, for image
classification the raw image bytes (often without a content type), or `{"inputs": "<base64>",
"parameters": {"top_k", "function_to_apply"}}` once parameters are set. The answers are the
pipelines' own lists: `[{"label", "score"}]`, and `[{"score", "token", "token_str", "sequence"}]`
for one [MASK] (a list of such lists for several), which is what the client parses. Errors are
`{"error": "<message>"}` (the client shows that message) with the task routes' statuses.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.errors import InvalidInput, RequestError
from contract.formats import MAX_FILL_MASK_TOP_K
from contract.image import ACCEPTED_DESCRIPTION
from service.deadline import Deadline, before
from service.errors import REST_ERRORS, ErrorTable, validation_error
from service.http_io import (
    RAW_TYPES,
    decode_base64,
    get_state,
    media_type,
    unless_disconnected,
    unsupported_media_type,
)
from service.pipelines import FillMaskPipeline, VisionPipeline
from service.schemas import (
    MAX_TARGETS,
    MAX_TEXT_LENGTH,
    LabelScore,
    MaskPrediction,
    MessageError,
    Target,
    error_responses,
    inline_schema,
)

PREFIX = "/models/"
router = APIRouter(tags=["Hugging Face inference API"])


def hf_body(error: RequestError) -> dict[str, Any]:
    return {"error": error.message}


HF_ERRORS = ErrorTable(statuses=REST_ERRORS.statuses, body=hf_body)


class HFParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: int | None = Field(
        None,
        ge=1,
        le=MAX_FILL_MASK_TOP_K,
        description="results (per [MASK]); classifiers cap it at their labels",
    )
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
        "description": f"JSON, or for an image classifier the raw image ({ACCEPTED_DESCRIPTION}) with "
        "an image/* type, application/octet-stream or no content type",
        "content": {
            "application/json": {"schema": inline_schema(HFRequest)},
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}
HFResponse = list[LabelScore] | list[MaskPrediction] | list[list[MaskPrediction]]


async def _read(request: Request, *, json_only: bool) -> tuple[HFRequest | None, bytes]:
    """The JSON request, or (for a classifier) the raw image bytes."""
    mime = media_type(request)
    if mime == "application/json" or mime.endswith("+json"):
        raw = await request.body()
        try:
            return HFRequest.model_validate_json(raw), b""
        except ValidationError as exc:
            raise validation_error(list(exc.errors()), "the JSON body") from None
    if json_only:
        raise unsupported_media_type(mime, 'send JSON {"inputs": "text with [MASK]", "parameters": {...}}')
    if mime not in RAW_TYPES and not mime.startswith("image/"):
        raise unsupported_media_type(mime, 'send the image as the raw body, or JSON {"inputs": "<base64>"}')
    data = await request.body()
    if not data:
        raise InvalidInput("empty_image", f"the image is empty; send a {ACCEPTED_DESCRIPTION} file")
    return None, data


async def _run(request: Request, name: str, deadline: Deadline) -> Any:
    served = get_state(request).model(name)
    body, image = await before(_read(request, json_only=isinstance(served, FillMaskPipeline)), deadline)
    params = (body.parameters if body else None) or HFParameters()
    if isinstance(served, FillMaskPipeline):
        assert body is not None
        if params.function_to_apply is not None:
            raise InvalidInput("invalid_parameter", "function_to_apply applies to image classification only")
        predictions = await served.fill_mask(body.inputs, params.top_k or 5, params.targets, deadline)
        return predictions[0] if len(predictions) == 1 else predictions
    if not isinstance(served, VisionPipeline):  # pragma: no cover - every task is one of the two
        raise InvalidInput("wrong_task", f"model {name} serves no task of this API")
    if params.targets is not None:
        raise InvalidInput("invalid_parameter", "targets apply to fill-mask only")
    if body is not None:
        image = decode_base64(body.inputs, "inputs")
    top_k = min(params.top_k or 5, len(served.labels))  # as HF's pipeline does: at most every label
    return await served.classify(image, top_k, deadline, params.function_to_apply or "softmax")


@router.post(
    "/models/{name}",
    response_model=HFResponse,
    responses=error_responses(MessageError),
    openapi_extra=_BODY,
    summary="Hugging Face inference API (fill-mask, image classification)",
)
async def hf_inference(request: Request, name: str) -> Any:
    deadline = Deadline.after(get_state(request).settings.request_timeout_s)
    return await unless_disconnected(request, _run(request, name, deadline))


__all__ = ["router", "HF_ERRORS", "PREFIX", "HFRequest"]
