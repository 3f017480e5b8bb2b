"""The Hugging Face inference API: `POST /models/{name}`, as Inference Endpoints serve it.

`huggingface_hub.InferenceClient(model="http://HOST:PORT/models/NAME")` posts to that URL as given:
for fill-mask `{"inputs": "text with [MASK]", "parameters": {"top_k", "targets"}}`, for image
classification the raw image bytes (often without a content type), or `{"inputs": "<base64>",
"parameters": {"top_k", "function_to_apply"}}` once parameters are set. A raw body is the input
itself: a classifier's image, a masked LM's UTF-8 text (so that one operation accepts what its
schema documents for either kind of model). What the input and the parameters mean is the
task's pipeline (`Pipeline.hf_answer`); the answers are the pipelines' own lists:
`[{"label", "score"}]`, and `[{"score", "token", "token_str", "sequence"}]` for one [MASK] (a
list of such lists for several), which is what the client parses. Errors are `{"error":
"<message>"}` (the client shows that message) with the task routes' statuses.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from contract.errors import ErrorCode, InvalidInput
from contract.image import ACCEPTED_DESCRIPTION
from service.access.scope import Scope
from service.engine.request_context import Deadline, before
from service.http.errors import REST_ERRORS, ErrorTable, message_body
from service.http.parsing import (
    MAX_TEXT_LENGTH,
    RAW_TYPES,
    Targets,
    TopK,
    json_body,
    media_type,
    unsupported_media_type,
    validated,
)
from service.http.routing import (
    DirectRoute,
    get_state,
    json_answer,
    requires,
    timing_headers,
    unless_disconnected,
)
from service.http.schemas import (
    LabelScore,
    MaskPrediction,
    MessageError,
    error_responses,
    examples,
    inline_schema,
)
from service.tasks.pipeline import HFOptions, Pipeline

HF_ERRORS = ErrorTable(statuses=REST_ERRORS.statuses, body=message_body, transport="hf")
# The API's routes and any other path below its prefix answer in its error shape; GET /models (the
# task API's listing) is a route of its own and keeps the REST shape.
PREFIX = "/models"
router = APIRouter(
    prefix=PREFIX, tags=["Hugging Face inference API"], route_class=DirectRoute.answering(HF_ERRORS)
)


class HFParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: TopK | None = Field(None, description="results (per [MASK]); classifiers cap it at their labels")
    targets: Targets | None = Field(None, description="fill-mask: restrict the candidates to these words")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None, description="image classification: how logits become scores (default softmax)"
    )


class HFRequest(BaseModel):
    model_config = examples(
        {"inputs": "paris is the [MASK] of france.", "parameters": {"top_k": 3}}, extra="forbid"
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


async def _read(request: Request, served: Pipeline) -> tuple[str | bytes, HFParameters]:
    """The JSON request's `inputs` and parameters; else the raw body: the input file itself, or
    (a task whose input is text) UTF-8 text, validated as the JSON `inputs` is."""
    mime = media_type(request)
    if mime == "application/json" or mime.endswith("+json"):
        body = json_body(await request.body(), HFRequest, "the JSON body")
        return body.inputs, body.parameters or HFParameters()
    if mime not in RAW_TYPES and not mime.startswith(("image/", "text/")):
        raise unsupported_media_type(mime, 'send JSON {"inputs": ..., "parameters": {...}} or the raw input')
    data = await request.body()
    if not data:
        raise InvalidInput(ErrorCode.EMPTY_BODY, "the body is empty; send the image or the text")
    if served.hf_text_input:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(ErrorCode.INVALID_TEXT, "a raw text body must be UTF-8") from None
        return validated(HFRequest, {"inputs": text}, "the JSON body").inputs, HFParameters()
    return data, HFParameters()


@router.post(
    "/{name}",
    response_model=list[LabelScore] | list[MaskPrediction] | list[list[MaskPrediction]],
    responses=error_responses(MessageError),
    openapi_extra=_BODY,
    summary="Hugging Face inference API (fill-mask, image classification)",
)
@requires(Scope.INFER)
async def hf_inference(request: Request, name: str) -> JSONResponse:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    with state.lease(name, None, kind=Pipeline) as served:  # either task; held until the answer is back
        inputs, parameters = await before(_read(request, served), deadline)
        options = HFOptions(**parameters.model_dump())
        answer = await unless_disconnected(request, served.hf_answer(inputs, options, deadline))
    headers = timing_headers(state.settings.server_timing, answer.timings, deadline)
    return await json_answer(answer.value, answer.value, headers)
