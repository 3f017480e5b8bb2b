"""Open Inference Protocol v2 over HTTP/REST, with the binary tensor data extension.

What stock clients (tritonclient.http, KServe's InferenceRESTClient, curl) send works unchanged:
a JSON body with or without a content type; with `Inference-Header-Content-Length: N`, N bytes of
JSON followed by the raw tensors of the inputs whose parameters carry `binary_data_size`, in input
order. Outputs come back as raw bytes after the JSON when asked (`binary_data` per output, or
`binary_data_output` for all), with the same header on the response. Health answers 200 for true and
400 for false, as the protocol says. Errors take the protocol's shape, `{"error": "<message>"}`,
with the statuses of `V2_ERRORS`. The model-repository extension (`repository_router`) lists every
version the service knows with its state and, unless READY, the reason; load and unload are taken
in explicit model control only (`inference.load_model`, `ServiceState.unload_model`, as over gRPC).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contract.errors import ErrorCode, InvalidInput
from contract.messages import echo
from contract.tensors import Tensor, from_json, from_raw
from service.access.scope import Scope
from service.engine.request_context import Deadline, before, encode_off_loop
from service.http.errors import REST_ERRORS, ErrorTable, message_body
from service.http.parsing import RAW_TYPES, json_body, media_type, unsupported_media_type
from service.http.routing import (
    DirectRoute,
    get_state,
    model_response,
    public,
    requires,
    timing_headers,
    unless_disconnected,
)
from service.http.schemas import VersionState
from service.tasks.pipeline import Pipeline
from service.v2 import inference
from service.v2.inference import InferRequest, InferResult
from service.v2.schemas import (
    ERROR_RESPONSES,
    INFER_DOC,
    INFER_RESPONSES,
    ControlRequest,
    IndexRequest,
    InferRequestBody,
    Live,
    ModelConfigBody,
    ModelMetadata,
    ModelReadyBody,
    ModelStatisticsBody,
    Ready,
    ServerMetadata,
)

PREFIX = "/v2"
REPOSITORY_PREFIX = "/v2/repository"
HEADER_LENGTH = "Inference-Header-Content-Length"
_JSON_TYPES = ("application/json", *RAW_TYPES)
# Elements of an output's `data` converted and encoded at a time: about a millisecond per slice.
SLICE_ELEMENTS = 8192


# The REST task routes' statuses, except that the protocol (like Triton) answers a malformed or
# unfitting request with 400.
V2_ERRORS = ErrorTable(
    statuses={**REST_ERRORS.statuses, InvalidInput: 400}, body=message_body, transport="v2"
)

# Every path below /v2, whether a route takes it or not, answers in the protocol's error shape.
router = APIRouter(
    prefix=PREFIX, tags=["Open Inference Protocol v2"], route_class=DirectRoute.answering(V2_ERRORS)
)

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: ERROR_RESPONSES[404]}


def _flag(ok: bool, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=200 if ok else 400)


def _false(body: type, description: str) -> dict[int | str, dict[str, Any]]:
    return {400: {"model": body, "description": description}}


@router.get("", response_model=ServerMetadata, summary="Server metadata")
@requires(Scope.INFER)
async def server_metadata(request: Request) -> JSONResponse:
    return model_response(ServerMetadata.model_validate(inference.server_metadata()))


@router.get("/health/live", response_model=Live, responses=_false(Live, "not live"), summary="Server live")
@public
async def live(request: Request) -> JSONResponse:
    ok = inference.server_live(get_state(request))
    return _flag(ok, {"live": ok})


@router.get(
    "/health/ready", response_model=Ready, responses=_false(Ready, "not ready"), summary="Server ready"
)
@public
async def ready(request: Request) -> JSONResponse:
    ok = get_state(request).ready
    return _flag(ok, {"ready": ok})


# Before /models/{name}: "stats" is no model name here, as in Triton.
@router.get("/models/stats", response_model=ModelStatisticsBody, summary="Statistics of every model")
@requires(Scope.INFER)
async def all_statistics(request: Request) -> Response:
    return await _statistics(request, "", "")


ModelHandler = Callable[[Request, str, str], Awaitable[Response]]


def _model_routes(
    method: str,
    suffix: str,
    response_model: Any,
    names: tuple[str, str],
    summary: str,
    scope: Scope | None = Scope.INFER,
    **route: Any,
) -> Callable[[ModelHandler], ModelHandler]:
    """Decorator: the handler answers `/models/{name}{suffix}` (the newest ready version, the
    version "") and its twin `/models/{name}/versions/{version}{suffix}` (the version named); a
    model's 404 is documented unless `responses` says otherwise."""
    route = {"responses": _NOT_FOUND, **route, "response_model": response_model}

    def register(handler: ModelHandler) -> ModelHandler:
        @requires(scope)
        async def newest(request: Request, name: str) -> Response:
            return await handler(request, name, "")

        add = partial(router.add_api_route, methods=[method], **route)
        add(path=f"/models/{{name}}{suffix}", endpoint=newest, name=names[0], summary=summary)
        versioned = f"/models/{{name}}/versions/{{version}}{suffix}"
        add(
            path=versioned, endpoint=requires(scope)(handler), name=names[1], summary=f"{summary} (a version)"
        )
        return handler

    return register


@_model_routes("GET", "", ModelMetadata, ("model_metadata", "model_version_metadata"), "Model metadata")
async def _metadata(request: Request, name: str, version: str) -> JSONResponse:
    state = get_state(request)
    document = inference.model_metadata(state, inference.resolve(state, name, version))
    return model_response(ModelMetadata.model_validate(document))


@_model_routes(
    "GET",
    "/ready",
    ModelReadyBody,
    ("model_ready", "model_version_ready"),
    "Model ready",
    scope=None,
    responses={**_false(ModelReadyBody, "not ready"), **_NOT_FOUND},
)
async def _model_ready(request: Request, name: str, version: str) -> JSONResponse:
    state = get_state(request)
    model = inference.resolve(state, name, version)
    ok = state.version_ready(model.name, model.version)
    return _flag(ok, {"name": name, "ready": ok})


@_model_routes("GET", "/config", ModelConfigBody, ("config", "version_config"), "Model configuration")
async def _config(request: Request, name: str, version: str) -> JSONResponse:
    state = get_state(request)
    document = inference.model_config(state, inference.resolve(state, name, version))
    return model_response(ModelConfigBody.model_validate(document))


@_model_routes("GET", "/stats", ModelStatisticsBody, ("statistics", "version_statistics"), "Model statistics")
async def _statistics(request: Request, name: str, version: str) -> JSONResponse:
    document = inference.model_statistics(get_state(request), name, version)
    return model_response(ModelStatisticsBody.model_validate(document))


async def read_infer_request(request: Request) -> tuple[InferRequest, Callable[[str], bool]]:
    """The request, and which outputs (by name) to return as binary data."""
    mime = media_type(request)
    if mime not in _JSON_TYPES and not mime.endswith("+json"):
        raise unsupported_media_type(mime, "send JSON, or JSON followed by binary tensors (octet-stream)")
    raw = await request.body()
    head, tail = raw, b""
    if (length := request.headers.get(HEADER_LENGTH)) is not None:
        # ASCII digits only ("²".isdigit() is true, and int() refuses it), at most those of any length.
        if not (length.isascii() and length.isdigit() and len(length) <= 19) or int(length) > len(raw):
            raise InvalidInput(
                ErrorCode.INVALID_HEADER,
                f"{HEADER_LENGTH} must be the JSON's length in bytes (0..{len(raw)}), got {echo(length)}",
            )
        head, tail = raw[: int(length)], raw[int(length) :]
    if not head:
        raise InvalidInput(ErrorCode.EMPTY_BODY, "the body is empty; send a JSON inference request")
    body = json_body(head, InferRequestBody, "the inference request")
    inputs, offset = [], 0
    for tensor in body.inputs:
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is not None:
            if offset + size > len(tail):
                raise InvalidInput(
                    ErrorCode.INVALID_BINARY, f"input {tensor.name}: {size} bytes announced, fewer sent"
                )
            inputs.append(from_raw(tensor.name, tensor.datatype, tensor.shape, tail[offset : offset + size]))
            offset += size
        elif tensor.data is None:
            raise InvalidInput(
                ErrorCode.INVALID_INPUTS, f"input {tensor.name} has neither data nor binary_data_size"
            )
        else:
            inputs.append(from_json(tensor.name, tensor.datatype, tensor.shape, tensor.data))
    if offset != len(tail):
        raise InvalidInput(
            ErrorCode.INVALID_BINARY, f"{len(tail) - offset} bytes of binary data belong to no input"
        )
    parameters = body.parameters.model_dump(exclude_none=True) if body.parameters else {}
    default_binary = bool(parameters.get("binary_data_output", False))
    flags = [(o.name, o.parameters.binary_data if o.parameters else None) for o in body.outputs or []]
    binary = {name for name, flag in flags if (default_binary if flag is None else flag)}
    outputs = [name for name, _ in flags]
    request_ = InferRequest(inputs, outputs, body.id or "", parameters)
    # Without a list of outputs, binary_data_output applies to every output produced.
    return request_, inference.all_raw if default_binary and not outputs else binary.__contains__


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_data(tensor: Tensor) -> str:
    """`json.dumps(tensor.json_data())`, `SLICE_ELEMENTS` at a time (each slice by
    `Tensor.json_data`, so the elements are written by the one rule, non-finite floats as null)."""
    size = int(tensor.array.size)
    slices = (tensor.json_data(i, i + SLICE_ELEMENTS) for i in range(0, size, SLICE_ELEMENTS))
    return "[" + ",".join(_dumps(values)[1:-1] for values in slices) + "]"


def answer_json(
    head: dict[str, Any], outputs: Sequence[Tensor], raw: Callable[[Tensor], dict[str, Any] | None]
) -> bytes:
    """The answer document: `head` (model name, version, id), then each output's metadata and
    either the parameters `raw` gives it (an output sent as binary data) or its JSON `data`, last.

    `json.dumps` of one list holds the GIL from its first number to its last: on millions of
    numbers that is seconds in which no other thread runs, the event loop included, even when the
    encoding runs in a worker thread. So each output's `data` is written slice by slice
    (`json_data`), the GIL free between slices; the text is exactly what `_dumps` writes for the
    whole answer."""
    texts = []
    for tensor in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if (parameters := raw(tensor)) is not None:
            texts.append(_dumps({**entry, "parameters": parameters}))
        else:
            texts.append(_dumps(entry)[:-1] + ',"data":' + json_data(tensor) + "}")
    return (_dumps(head)[:-1] + ',"outputs":[' + ",".join(texts) + "]}").encode()


def encode_response(result: InferResult, is_raw: Callable[[str], bool]) -> Response:
    """JSON (`answer_json`), or JSON followed by the binary outputs (with the header that says
    where the JSON ends)."""
    blobs: list[bytes] = []

    def raw(tensor: Tensor) -> dict[str, Any] | None:
        if not is_raw(tensor.name):
            return None
        blobs.append(tensor.raw())
        return {"binary_data_size": len(blobs[-1])}

    head: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version}
    if result.id:
        head["id"] = result.id
    document = answer_json(head, result.outputs, raw)
    if not blobs:
        return Response(document, media_type="application/json")
    return Response(
        document + b"".join(blobs),
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(document))},
    )


@_model_routes(
    "POST",
    "/infer",
    None,
    ("infer", "infer_version"),
    "Inference",
    responses=INFER_RESPONSES,
    openapi_extra=INFER_DOC,
)
async def _infer(request: Request, name: str, version: str) -> Response:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    model = inference.resolve(state, name, version)
    # 404 / 503 before the body is read; the version is held until the answer is back.
    with state.lease(model.name, model.version, kind=Pipeline) as served:
        infer_request, is_raw = await before(read_infer_request(request), deadline)
        result = await unless_disconnected(
            request, inference.infer(state, model, served, infer_request, deadline, is_raw)
        )
    response = await encode_off_loop(lambda: encode_response(result, is_raw), result.size.total)
    if (timing := timing_headers(state.settings.server_timing, result.timings, deadline)) is not None:
        response.headers.update(timing)
    return response


# The model-repository extension, as tritonclient.http calls it (an empty body, or JSON; any content
# type): every path below its prefix is a control route, which access control gives the admin scope.
repository_router = APIRouter(
    prefix=REPOSITORY_PREFIX,
    tags=["Open Inference Protocol v2: model repository"],
    route_class=DirectRoute.answering(V2_ERRORS),
)


async def _body(request: Request, schema: type[Any]) -> Any:
    raw = await request.body()
    if not raw.strip():
        return schema()
    return json_body(raw, schema, "the request body")


@repository_router.post(
    "/index", response_model=list[VersionState], responses=ERROR_RESPONSES, summary="Repository index"
)
@requires(Scope.ADMIN)
async def repository_index(request: Request) -> JSONResponse:
    body = await _body(request, IndexRequest)
    return JSONResponse([vars(entry) for entry in get_state(request).index(body.ready)])


@repository_router.post("/models/{name}/load", responses=ERROR_RESPONSES, summary="Load a model")
@requires(Scope.ADMIN)
async def load_model(request: Request, name: str) -> Response:
    body = await _body(request, ControlRequest)
    await inference.load_model(get_state(request), name, body.parameters)
    return Response(status_code=200)


@repository_router.post("/models/{name}/unload", responses=ERROR_RESPONSES, summary="Unload a model")
@requires(Scope.ADMIN)
async def unload_model(request: Request, name: str) -> Response:
    await _body(request, ControlRequest)
    await get_state(request).unload_model(name)
    return Response(status_code=200)
