"""One error type and one JSON error shape for every failure a client can see.

Everything the service rejects is a `ServiceError` carrying an HTTP status, a stable machine code and
a message that says what was wrong *and what is accepted*, so a client can fix the request without
reading our source. The handlers installed by `install_error_handlers` render FastAPI's own
validation errors, Starlette's 404/405 and unexpected exceptions in that same shape:

    {"error": {"code": "invalid_image", "message": "...", "details": [...]}}
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)

# nginx's "client closed request": never reaches the client, but keeps metrics honest.
CLIENT_CLOSED_REQUEST = 499


class ServiceError(Exception):
    """A request we refuse, with the status code and message the client will get."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        details: list[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.details = details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(code: str, message: str) -> ServiceError:
    return ServiceError(400, code, message)


def unprocessable(code: str, message: str, details: list[Any] | None = None) -> ServiceError:
    return ServiceError(422, code, message, details=details)


def payload_too_large(limit: int, what: str = "request body") -> ServiceError:
    return ServiceError(413, "payload_too_large", f"{what} is larger than the limit of {limit} bytes")


def unsupported_media_type(got: str | None, accepted: str) -> ServiceError:
    return ServiceError(
        415, "unsupported_media_type", f"content type {got or '(none)'!r} is not accepted; {accepted}"
    )


def overloaded(reason: str, retry_after_s: int = 1) -> ServiceError:
    return ServiceError(503, "overloaded", reason, headers={"Retry-After": str(retry_after_s)})


def deadline_exceeded(timeout_s: float) -> ServiceError:
    return ServiceError(
        504, "timeout", f"the request did not complete within its deadline of {timeout_s:g} s"
    )


def client_closed() -> ServiceError:
    return ServiceError(CLIENT_CLOSED_REQUEST, "client_closed_request", "the client disconnected")


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    """FastAPI's error list without the echoed input, which may be a large or binary body."""
    return [{k: v for k, v in err.items() if k in ("loc", "msg", "type")} for err in exc.errors()]


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return exc.response()


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = _validation_details(exc)
    summary = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in details)
    return unprocessable("invalid_request", f"the request is invalid: {summary}", details).response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 400: "bad_request", 413: "payload_too_large"}
    err = ServiceError(
        exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), headers=exc.headers
    )
    return err.response()


async def _client_disconnect(_: Request, exc: Exception) -> JSONResponse:
    """The client left while we read its body: nothing to answer, not a server error."""
    return client_closed().response()


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A genuine bug: log it with the traceback, tell the client nothing internal."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return ServiceError(500, "internal_error", "internal server error; the error was logged").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(Exception, _unexpected_error)


__all__ = [
    "ServiceError",
    "install_error_handlers",
    "bad_request",
    "unprocessable",
    "payload_too_large",
    "unsupported_media_type",
    "overloaded",
    "deadline_exceeded",
    "client_closed",
    "CLIENT_CLOSED_REQUEST",
]
