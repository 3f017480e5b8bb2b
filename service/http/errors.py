"""HTTP error responses: core errors (`contract.errors`) -> status codes, one table per API.

Below the transports nothing chooses a status code: preprocessing, the text codec, the batcher and
the pipelines raise transport-free errors with a machine code and a message that says what is
accepted. An `ErrorTable` is the whole mapping of one API (its status per error type and the shape
of its body: REST's `{"error": {"code", "message", "details"?}}`, or `{"error": "<message>"}`);
each route carries its API's table (`service.http.routing.DirectRoute`), so a client sees one shape
per API. `ErrorResponder.exception` is the one exception path of every HTTP request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette._utils import get_route_path  # the router's own rule, as FastAPI's router uses it
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import Scope

from contract.errors import (
    ClientGone,
    DeadlineExceeded,
    ErrorCode,
    HeadersTooLarge,
    InputTooLarge,
    InternalError,
    InvalidInput,
    MalformedRequest,
    MethodNotAllowed,
    MisdirectedRequest,
    ModelNotFound,
    PermissionDenied,
    RateLimited,
    RequestError,
    RequestTimeout,
    RouteNotFound,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
    most_specific,
)
from contract.messages import ECHO_LIMIT, echo, escape_controls, shorten
from service.engine import request_context

log = logging.getLogger(__name__)

# nginx's "client closed request": never reaches the client, but keeps metrics honest.
CLIENT_CLOSED_REQUEST = 499
INTERNAL_ERROR = 500

Body = Callable[[RequestError], dict[str, Any]]


def rest_body(error: RequestError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details is not None:
        body["details"] = error.details
    return {"error": body}


def message_body(error: RequestError) -> dict[str, Any]:
    """`{"error": "<message>"}`: the Open Inference Protocol's and Hugging Face's shape."""
    return {"error": error.message}


@dataclass(frozen=True)
class ErrorTable:
    """How one API answers a refusal: the HTTP status of each core error type and its body shape.

    The statuses are looked up by the error's class, the most specific entry winning (so an API
    can single out `Overloaded` among `Unavailable`s); a type without an entry (`InternalError`)
    is answered 500. A new API is a new table, never new error types.
    """

    statuses: Mapping[type[RequestError], int]
    body: Body
    transport: str = "rest"  # the label of its refusals in gmlp_refusals_total

    def status(self, kind: type[RequestError]) -> int:
        """The status of an error of type `kind`."""
        return most_specific(self.statuses, kind, INTERNAL_ERROR)

    def response(self, error: RequestError, *, status: int | None = None) -> JSONResponse:
        headers = {}
        if isinstance(error, Unavailable) and error.retry_after_s is not None:
            headers["Retry-After"] = str(error.retry_after_s)
        if isinstance(error, Unauthenticated):
            headers["WWW-Authenticate"] = 'Bearer realm="gmlp-serve"'
        if isinstance(error, RequestTimeout):
            headers["Connection"] = "close"  # uvicorn closes the connection once this is sent
        return JSONResponse(self.body(error), status_code=status or self.status(type(error)), headers=headers)


REST_ERRORS = ErrorTable(
    statuses={
        InvalidInput: 422,
        MalformedRequest: 400,
        InputTooLarge: 413,
        HeadersTooLarge: 431,
        UnsupportedMediaType: 415,
        ModelNotFound: 404,
        RouteNotFound: 404,
        MethodNotAllowed: 405,
        Unavailable: 503,
        DeadlineExceeded: 504,
        ClientGone: CLIENT_CLOSED_REQUEST,
        Unauthenticated: 401,
        PermissionDenied: 403,
        RateLimited: 429,
        RequestTimeout: 408,
        MisdirectedRequest: 421,
    },
    body=rest_body,
)
# Refusals by the HTTP server itself, before any route (the connection cap): the REST shape and
# statuses, counted as the "http" transport whatever the path.
CONNECTION_ERRORS = replace(REST_ERRORS, transport="http")


@dataclass(frozen=True)
class ErrorResponder:
    """Renders a refusal with the error table of the route a request is for, and counts it.

    The route is the one the request gate matched (`route`, or `scope["route"]` once recorded); a
    route without a table of its own, and a path no route takes, get the table of the router prefix
    it falls under (`namespaces`), else `REST_ERRORS`."""

    namespaces: Mapping[str, ErrorTable] = field(default_factory=dict)
    # Called with (transport, machine code) for every error answered: what an operator sees shed.
    observe: Callable[[str, str], None] | None = None

    def table(self, scope: Scope, route: BaseRoute | None = None) -> ErrorTable:
        table = getattr(route or scope.get("route"), "errors", None)
        if isinstance(table, ErrorTable):
            return table
        path = get_route_path(scope)
        for prefix, owned in self.namespaces.items():
            if path == prefix or path.startswith(prefix + "/"):
                return owned
        return REST_ERRORS

    def response(
        self,
        scope: Scope,
        error: RequestError,
        *,
        route: BaseRoute | None = None,
        status: int | None = None,
    ) -> JSONResponse:
        if isinstance(error, DeadlineExceeded) and scope.get(BODY_PENDING):
            # The deadline passed while the client was still sending: its slowness, not ours.
            error = RequestTimeout(
                ErrorCode.REQUEST_TIMEOUT,
                f"the body did not arrive in time: {error.message}; the connection is closed",
            )
        return self.answer(self.table(scope, route), error, status=status)

    def answer(self, table: ErrorTable, error: RequestError, *, status: int | None = None) -> JSONResponse:
        """`error` rendered by `table` and observed under its transport."""
        if self.observe is not None:
            self.observe(table.transport, error.code)
        request_context.note_error(error.code, error.message)
        return table.response(error, status=status)

    def exception(self, scope: Scope, exc: Exception, route: BaseRoute | None = None) -> JSONResponse:
        """The answer to what a route raised: the service's refusals, FastAPI's validation errors,
        Starlette's own (unknown path, wrong method, unparsable multipart: their status and
        headers kept), a client gone while its body was read; anything else is a bug, logged with
        the request's method and path and answered 500 `internal_error`, nothing internal shown."""
        status: int | None = None
        headers: Mapping[str, str] = {}
        if isinstance(exc, RequestError):
            error = exc
        elif isinstance(exc, RequestValidationError):
            error = validation_error(list(exc.errors()), "the request")
        elif isinstance(exc, StarletteHTTPException):
            kind, code = FRAMEWORK_ERRORS.get(exc.status_code, (RequestError, ErrorCode.HTTP_ERROR))
            error = kind(code, str(exc.detail))
            # A status of the framework's own that no type stands for is answered as it is.
            status = exc.status_code if error.code == ErrorCode.HTTP_ERROR else None
            headers = exc.headers or {}
        elif isinstance(exc, ClientDisconnect):
            error = client_gone()  # nothing to answer, and not a server error
        else:
            log.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
            error = InternalError(ErrorCode.INTERNAL_ERROR, "internal server error; the error was logged")
        response = self.response(scope, error, route=route, status=status)
        response.headers.update(headers)
        return response


# Set in a request's scope while its body has not all arrived (`service.http.gate`).
BODY_PENDING = "gmlp.body_pending"


def payload_too_large(limit: int) -> InputTooLarge:
    return InputTooLarge(
        ErrorCode.PAYLOAD_TOO_LARGE, f"request body is larger than the limit of {limit} bytes"
    )


def content_encoded(encoding: str) -> UnsupportedMediaType:
    """The refusal of a compressed body: its size on the wire says nothing of what it inflates to."""
    return UnsupportedMediaType(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        f"Content-Encoding {echo(encoding)} is not accepted: send the body uncompressed (no "
        "Content-Encoding, or identity), so that its size is what the body limit counts",
    )


def client_gone() -> ClientGone:
    return ClientGone(ErrorCode.CLIENT_CLOSED_REQUEST, "the client disconnected")


# The most validation errors a refusal lists (a body with thousands of unknown fields gets these).
MAX_DETAILS = 20


def _location(part: Any) -> Any:
    """A part of an error's location as echoed: a client's key is cut and escaped like any echo."""
    return part if isinstance(part, int) else shorten(escape_controls(str(part)), ECHO_LIMIT)


def validation_error(errors: list[Any], where: str) -> InvalidInput:
    """FastAPI's or pydantic's error list as one InvalidInput (without echoing the input back; the
    first `MAX_DETAILS` errors, their locations, which may be a client's keys, cut as echoes are)."""
    details = [
        {"loc": [_location(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in errors[:MAX_DETAILS]
    ]
    summary = "; ".join(f"{'.'.join(map(str, d['loc'])) or 'body'}: {d['msg']}" for d in details)
    return InvalidInput(ErrorCode.INVALID_REQUEST, f"{where} is invalid: {summary}", details=details)


# Starlette's own refusals (unknown path, wrong method, unparsable multipart) as ours, by status.
FRAMEWORK_ERRORS: dict[int, tuple[type[RequestError], ErrorCode]] = {
    404: (RouteNotFound, ErrorCode.NOT_FOUND),
    405: (MethodNotAllowed, ErrorCode.METHOD_NOT_ALLOWED),
    400: (MalformedRequest, ErrorCode.BAD_REQUEST),
    413: (InputTooLarge, ErrorCode.PAYLOAD_TOO_LARGE),
}
