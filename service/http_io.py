"""HTTP plumbing shared by the routes: body limits, payload and query parsing, direct routes, deadlines,
disconnects.

Bodies are parsed here rather than by FastAPI's `File`/`Body` parameters because FastAPI turns any
error raised while reading a body into a bare 400; we want 413 for too large, 415 for a wrong
content type and 422 for bad JSON, each with a message that says what is accepted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract.errors import InputTooLarge, InvalidInput, UnsupportedMediaType
from contract.image import ACCEPTED_DESCRIPTION
from service.asgi import HttpMiddleware
from service.errors import ErrorResponder, client_gone, payload_too_large, validation_error
from service.schemas import ClassifyJSONRequest
from service.state import ServiceState

HEADERS_TOO_LARGE = 431
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class BodyLimitMiddleware(HttpMiddleware):
    """431 for a request line plus headers over `max_header_bytes`; 413 for bodies over `max_bytes`,
    early from Content-Length and by counting what is read.

    The Content-Length check rejects honest clients before they upload; the count catches chunked
    uploads and lying headers, so no request can make us buffer more than the limit. (uvicorn's
    HTTP parser has read the headers by then: a reverse proxy's limit bounds that, if needed.)
    """

    def __init__(self, app: ASGIApp, max_bytes: int, errors: ErrorResponder, max_header_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes
        self.errors = errors

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        header_bytes = len(scope.get("raw_path") or b"") + sum(
            len(k) + len(v) + 4 for k, v in scope["headers"]
        )
        if header_bytes > self.max_header_bytes:
            error = InputTooLarge(
                "headers_too_large",
                f"the request line and headers are {header_bytes} bytes; at most {self.max_header_bytes} "
                "are accepted",
            )
            await self.errors.response(scope["path"], error, status=HEADERS_TOO_LARGE)(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            response = self.errors.response(scope["path"], payload_too_large(self.max_bytes))
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise payload_too_large(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


# Content types that say nothing about a raw body: none, generic bytes, and curl's default for
# `--data-binary` (which is not a form here). Such bodies are read for what they are (an image is
# recognised from its bytes, v2 JSON parsed), as Triton does.
RAW_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")


class DirectRoute(APIRoute):
    """A route whose endpoint reads its own request and returns its own Response.

    FastAPI's per-request machinery (dependency solving, parameter validation, response
    serialisation) is skipped: measured with py-spy under load it was about a tenth of the event
    loop's CPU per /classify request. In the app, `service.dispatch` calls the endpoint before
    FastAPI's router is reached at all; `get_route_handler` serves wherever the router runs it.
    The route is still an APIRoute, so OpenAPI documents its body, parameters
    (`query_parameters`) and response model as before. The endpoint takes the Request and the
    route's path parameters (as strings); anything FastAPI would have to inject is refused when
    the route is declared.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        dependant = self.dependant
        injected = (
            dependant.query_params,
            dependant.header_params,
            dependant.cookie_params,
            dependant.body_params,
            dependant.dependencies,
        )
        if any(injected) or dependant.request_param_name is None:
            raise TypeError(f"{self.path}: a direct endpoint takes the Request and path parameters only")
        endpoint = self.endpoint
        if not dependant.path_params:
            return endpoint

        async def with_path(request: Request) -> Response:
            return await endpoint(request, **request.path_params)

        return with_path


def read_query(request: Request, schema: type[M]) -> M:
    """Validate the query string against `schema` (422 `invalid_request`, as for a bad body)."""
    try:
        return schema.model_validate(dict(request.query_params))
    except ValidationError as exc:
        errors = [{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]
        raise validation_error(errors, "the request") from None


def query_parameters(schema: type[BaseModel]) -> list[dict[str, Any]]:
    """The OpenAPI parameter objects of a query `schema` read by `read_query`."""
    json_schema = schema.model_json_schema()
    required = set(json_schema.get("required", ()))
    return [
        {
            "name": name,
            "in": "query",
            "required": name in required,
            "description": prop.pop("description", ""),
            "schema": prop,
        }
        for name, prop in json_schema["properties"].items()
    ]


def model_response(body: BaseModel) -> JSONResponse:
    """A direct route's document, built as its response model and serialised as FastAPI would."""
    return JSONResponse(body.model_dump(mode="json"))


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


def unsupported_media_type(got: str | None, accepted: str) -> UnsupportedMediaType:
    return UnsupportedMediaType(
        "unsupported_media_type", f"content type {got or '(none)'!r} is not accepted; {accepted}"
    )


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_image(request: Request) -> bytes:
    """The image of a /classify request: multipart field `file`, the raw body (image/*, octet-stream or
    no content type), or JSON `{"image": "<base64>"}` (for clients that only speak JSON)."""
    mime = media_type(request)
    if mime == "multipart/form-data":
        # max_part_size bounds the non-file fields; the body limit bounds the file.
        async with request.form(max_files=1, max_fields=16) as form:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise InvalidInput(
                    "missing_file", "the multipart upload needs the image in a file field named 'file'"
                )
            data = await upload.read()
    elif mime.startswith("image/") or mime in RAW_TYPES:
        # No (or a generic) content type: the decoder recognises the format from the bytes.
        data = await request.body()
    elif mime == "application/json":
        data = decode_base64((await read_json(request, ClassifyJSONRequest)).image, "image")
    else:
        raise unsupported_media_type(
            mime,
            f"send the image ({ACCEPTED_DESCRIPTION}) as multipart/form-data field 'file', as the raw body "
            '(image/*, application/octet-stream or no content type), or base64 in JSON {"image": ...}',
        )
    if not data:
        raise InvalidInput("empty_image", f"the image is empty; send a {ACCEPTED_DESCRIPTION} file")
    return data


def decode_base64(text: str, field: str) -> bytes:
    """An image sent base64-encoded in the JSON field `field`, plain or as a data: URL."""
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise InvalidInput(
                "invalid_base64", "a data: URL image must be base64-encoded (data:image/...;base64,...)"
            )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            "invalid_base64", "'image' is not valid base64; send the image file's bytes base64-encoded"
        ) from None


async def read_json(request: Request, schema: type[M]) -> M:
    """Validate a JSON body against `schema`; 415 for another content type, 422 for bad JSON."""
    mime = media_type(request)
    if mime != "application/json" and not mime.endswith("+json"):
        raise unsupported_media_type(mime, "send a JSON body with content type application/json")
    body = await request.body()
    if not body:
        raise InvalidInput("empty_body", "the body is empty; send a JSON object")
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(list(exc.errors()), "the JSON body") from None


async def _wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client goes away; the body has been read, so the next message is the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it if the client disconnects first.

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


__all__ = [
    "BodyLimitMiddleware",
    "DirectRoute",
    "model_response",
    "read_query",
    "query_parameters",
    "get_state",
    "read_image",
    "read_json",
    "unless_disconnected",
    "media_type",
    "decode_base64",
    "RAW_TYPES",
    "unsupported_media_type",
]
