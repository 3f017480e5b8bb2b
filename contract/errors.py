"""Transport-free errors: what went wrong, as a machine code of one closed list (`ErrorCode`) and a
message that says what is accepted. Each transport maps the error *types* to its own status codes
in one table (REST task routes: `service.http.errors`; Hugging Face API: `service.http.hf`; Open
Inference Protocol v2: `service.v2.rest`; gRPC: `service.v2.grpc_server`), read with
`most_specific`, as Hugging Face text-embeddings-inference maps its core errors in its router;
nothing below the transports chooses a status code.

Every code belongs to exactly one type, so a code's status on each transport follows from the
type: docs/service.md lists them all, and tests/service/test_error_codes.py keeps that table, the
raise sites and this list in step.

`UserError` is different: a problem with what an operator handed a command (a checkpoint, a model
repository, a setting). The CLI prints its message and exits non-zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum, unique
from typing import Any, TypeVar

from contract.messages import MESSAGE_LIMIT, escape_controls, shorten

S = TypeVar("S")


class UserError(ValueError):
    """A file, directory or setting given to a command cannot be used; the message says how to fix it.

    A ValueError, so that code which validates values keeps working; the CLI catches this type only."""


class RequestError(Exception):
    """Base of everything a request can be refused for: a code of `ErrorCode`, the type's own (a
    TypeError otherwise, since the transports' statuses and the documented table follow from it),
    a message that says what was wrong and what is accepted, and optional structured details.

    The message is kept on one line and to `MESSAGE_LIMIT` characters whatever went into it (the
    fields a message quotes are cut to `ECHO_LIMIT` by `echo`), so no request can make its own
    error, its log line or a gRPC status large."""

    def __init__(self, code: ErrorCode, message: str, *, details: list[Any] | None = None) -> None:
        if not isinstance(code, ErrorCode) or code.error is not type(self):
            raise TypeError(f"{type(self).__name__} with code {code!r}: not a code of that type in ErrorCode")
        message = shorten(escape_controls(message), MESSAGE_LIMIT)
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class InvalidInput(RequestError):
    """The request is malformed or does not fit the model (not an image, no [MASK], bad top_k...)."""


class MalformedRequest(InvalidInput):
    """The HTTP framework could not parse the request (a malformed multipart body)."""


class InputTooLarge(RequestError):
    """The input is over a size limit (bytes, pixels)."""


class HeadersTooLarge(InputTooLarge):
    """The request line and headers are over their limit."""


class UnsupportedMediaType(RequestError):
    """The payload is in an encoding the endpoint does not read."""


class ModelNotFound(RequestError):
    """No served model has that name (or no model of that task is served)."""


class RouteNotFound(RequestError):
    """No endpoint has that path."""


class MethodNotAllowed(RequestError):
    """The endpoint at that path does not take that method."""


class Unavailable(RequestError):
    """The service cannot take the request now; retrying after `retry_after_s` (None: unknown) may
    succeed."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after_s: int | None = 1) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s


class Overloaded(Unavailable):
    """The model's queue is full: load is shed at once rather than letting latency grow."""


class NotReady(Unavailable):
    """The models are loading, failed to load, or the service is shutting down."""


class Closed(Unavailable):
    """The model stopped accepting requests (shutting down)."""


class DeadlineExceeded(RequestError):
    """The request did not complete within its deadline."""


class ClientGone(RequestError):
    """The client disconnected before the answer was ready (nothing is sent; metrics count it)."""


class InternalError(RequestError):
    """A bug: the request should have been answered (logged with its traceback)."""


class Unauthenticated(RequestError):
    """No valid API key came with a request that needs one (401 with `WWW-Authenticate: Bearer`)."""


class PermissionDenied(RequestError):
    """The API key is valid but lacks the scope the route needs, or the route is closed (403)."""


class RateLimited(Unavailable):
    """The API key used up its request rate; retrying after `retry_after_s` succeeds (429)."""


class MisdirectedRequest(RequestError):
    """The request names a host (its `Host` header) this server does not answer for (421)."""


class RequestTimeout(RequestError):
    """The client did not send its request (the body) within the deadline: 408 and the connection closed."""


@unique
class ErrorCode(StrEnum):
    """Every machine code a request can be refused with, once each: the code, its error type (whose
    transports' tables give its status) and what it means. The wire format is the code itself."""

    error: type[RequestError]
    meaning: str

    def __new__(cls, code: str, error: type[RequestError], meaning: str) -> ErrorCode:
        member = str.__new__(cls, code)
        member._value_ = code
        member.error = error
        member.meaning = meaning
        return member

    # The request as a whole
    INVALID_REQUEST = (
        "invalid_request",
        InvalidInput,
        "the body or query does not fit its schema (bad JSON, a wrong or unknown field); see `details`",
    )
    BAD_REQUEST = (
        "bad_request",
        MalformedRequest,
        "the HTTP framework could not parse the request (a malformed multipart body), or an HTTP/1.1 "
        "request without exactly one Host header",
    )
    EMPTY_BODY = "empty_body", InvalidInput, "the body is empty"
    UNSUPPORTED_MEDIA_TYPE = (
        "unsupported_media_type",
        UnsupportedMediaType,
        "the content type is not one the endpoint reads (the message lists those it does), or the body "
        "is compressed (`Content-Encoding`)",
    )
    PAYLOAD_TOO_LARGE = "payload_too_large", InputTooLarge, "the body is larger than `GMLP_MAX_UPLOAD_BYTES`"
    HEADERS_TOO_LARGE = (
        "headers_too_large",
        HeadersTooLarge,
        "the request line and headers are larger than `GMLP_MAX_HEADER_BYTES`",
    )
    NOT_FOUND = "not_found", RouteNotFound, "no endpoint has this path"
    METHOD_NOT_ALLOWED = "method_not_allowed", MethodNotAllowed, "the endpoint does not take this method"
    HTTP_ERROR = (
        "http_error",
        RequestError,
        "any other refusal by the HTTP framework itself, with its own status",
    )
    # Images
    INVALID_IMAGE = (
        "invalid_image",
        InvalidInput,
        "not a readable image of an accepted format, truncated or corrupt, or not convertible to RGB",
    )
    EMPTY_IMAGE = "empty_image", InvalidInput, "the image has no bytes"
    IMAGE_TOO_LARGE = (
        "image_too_large",
        InputTooLarge,
        "the image has more pixels than `GMLP_MAX_IMAGE_PIXELS` (decompression bombs), or its resize "
        "before the crop would have more than `GMLP_MAX_RESIZED_PIXELS` (an extreme aspect ratio)",
    )
    MISSING_FILE = (
        "missing_file",
        InvalidInput,
        "/classify: a multipart upload without a file field named `file`",
    )
    INVALID_BASE64 = (
        "invalid_base64",
        InvalidInput,
        "a base64 image (/classify JSON, Hugging Face `inputs`) or its data: URL is not valid base64",
    )
    # Texts
    NO_MASK = "no_mask", InvalidInput, "the text has no [MASK] token once tokenised"
    TOO_MANY_MASKS = "too_many_masks", InvalidInput, "more [MASK] tokens than the model predicts per text"
    TEXT_TOO_LONG = "text_too_long", InvalidInput, "more tokens than the model's window n"
    INVALID_TARGET = "invalid_target", InvalidInput, "a fill-mask target that tokenizes to nothing"
    INVALID_TEXT = (
        "invalid_text",
        InvalidInput,
        "a text that is not UTF-8 (a Hugging Face raw body, a v2 `text` element)",
    )
    # Task parameters
    INVALID_TOP_K = (
        "invalid_top_k",
        InvalidInput,
        "top_k outside 1..the labels (classifiers) or 1..100 (masked LMs)",
    )
    INVALID_PARAMETER = (
        "invalid_parameter",
        InvalidInput,
        "Hugging Face API: a parameter of the other task (`targets`, `function_to_apply`)",
    )
    # Models
    MODEL_NOT_FOUND = (
        "model_not_found",
        ModelNotFound,
        "no served model has this name; the message lists those served",
    )
    NO_MODEL = "no_model", ModelNotFound, "the request names no model and no model of its task is served"
    WRONG_TASK = "wrong_task", InvalidInput, "the named model serves another task"
    VERSION_NOT_FOUND = (
        "version_not_found",
        ModelNotFound,
        "the model has no such version (v2 `versions/{v}`); the message lists its versions",
    )
    # Open Inference Protocol tensors
    INVALID_INPUTS = (
        "invalid_inputs",
        InvalidInput,
        "v2: the inputs do not fit the model (names, datatypes, shapes, rows, values), or one has no data",
    )
    INVALID_OUTPUTS = (
        "invalid_outputs",
        InvalidInput,
        "v2: a requested output is not produced for these inputs, or is requested twice",
    )
    INVALID_BATCH = "invalid_batch", InvalidInput, "v2: fewer than 1 or more than `GMLP_MAX_BATCH_SIZE` rows"
    INVALID_DATATYPE = "invalid_datatype", InvalidInput, "v2: a datatype that is not one of the protocol's"
    INVALID_SHAPE = (
        "invalid_shape",
        InvalidInput,
        "v2: a shape with a negative dimension, more than 16 dimensions, or non-zero dimensions "
        "multiplying to more than 2^31-1",
    )
    INVALID_TENSOR_DATA = (
        "invalid_tensor_data",
        InvalidInput,
        "v2: a tensor's data do not match its datatype or shape (an element of another kind: null, "
        "a boolean or a string for a number; a value out of the datatype's range); the message names it",
    )
    INVALID_HEADER = (
        "invalid_header",
        InvalidInput,
        "v2 REST: `Inference-Header-Content-Length` is not the length of the JSON",
    )
    INVALID_BINARY = (
        "invalid_binary",
        InvalidInput,
        "v2 REST: fewer or more bytes of binary tensor data than the inputs announce",
    )
    RESPONSE_TOO_LARGE = (
        "response_too_large",
        InputTooLarge,
        "v2: the outputs asked for would exceed `GMLP_MAX_RESPONSE_BYTES` as JSON (ask for binary data) "
        "or `GMLP_MAX_BINARY_RESPONSE_BYTES` as raw bytes",
    )
    # Load and lifecycle
    OVERLOADED = (
        "overloaded",
        Overloaded,
        "the model's queue is full (`GMLP_MAX_QUEUE_SIZE`); retry after `Retry-After`",
    )
    CLOSED = "closed", Closed, "the model stopped taking requests: the service is shutting down"
    NOT_READY = (
        "not_ready",
        NotReady,
        "the models are loading (`Retry-After`), failed to load, or the service is draining",
    )
    TOO_MANY_CONNECTIONS = (
        "too_many_connections",
        Unavailable,
        "the server holds `GMLP_MAX_CONNECTIONS` connections; REST shape on every path, connection closed",
    )
    TIMEOUT = "timeout", DeadlineExceeded, "the request did not complete within `GMLP_REQUEST_TIMEOUT_S`"
    CLIENT_CLOSED_REQUEST = (
        "client_closed_request",
        ClientGone,
        "the client left before the answer (only in metrics and logs)",
    )
    INTERNAL_ERROR = (
        "internal_error",
        InternalError,
        "a bug, logged once with the traceback and the request's method and path",
    )
    # Access control and slow clients
    UNAUTHENTICATED = (
        "unauthenticated",
        Unauthenticated,
        "no valid API key: send `Authorization: Bearer KEY` or `x-api-key: KEY` (`WWW-Authenticate: Bearer`)",
    )
    FORBIDDEN = (
        "forbidden",
        PermissionDenied,
        "the key lacks the route's scope (infer, admin, metrics), or admin routes are closed (no admin key)",
    )
    RATE_LIMITED = (
        "rate_limited",
        RateLimited,
        "the key used up its rate from the keys file; retry after `Retry-After`",
    )
    HOST_NOT_ALLOWED = (
        "host_not_allowed",
        MisdirectedRequest,
        "without API keys, a `Host` that is not an IP address, localhost or a name of "
        "`GMLP_ALLOWED_HOSTS` (DNS rebinding); the message names the setting",
    )
    REQUEST_TIMEOUT = (
        "request_timeout",
        RequestTimeout,
        "the headers (`GMLP_HEADER_TIMEOUT_S`) or the body (`GMLP_REQUEST_TIMEOUT_S`) came too slowly; "
        "connection closed",
    )
    # Model lifecycle (versions and the repository API)
    VERSION_UNAVAILABLE = (
        "version_unavailable",
        NotReady,
        "the model or version is known but not READY (loading, draining, or its load or check failed: "
        "the reason is in the message and the repository index)",
    )
    MODEL_CONTROL_DISABLED = (
        "model_control_disabled",
        InvalidInput,
        "v2 repository load/unload: only `GMLP_MODEL_CONTROL=explicit` takes them",
    )
    LOAD_FAILED = (
        "load_failed",
        InvalidInput,
        "v2 repository load: no selected version loaded, warmed up and passed its check; the serving "
        "versions are untouched and the index has the reasons",
    )
    TOO_MANY_VERSIONS = (
        "too_many_versions",
        InvalidInput,
        "v2 repository load: more versions of the model than `GMLP_MAX_LOADED_VERSIONS` would be "
        "loaded at once; nothing was loaded or unloaded",
    )
    INVALID_VERSION_POLICY = (
        "invalid_version_policy",
        InvalidInput,
        "v2 repository load: the `config` parameter is not JSON or its `version_policy` is not one of "
        "latest:N, all, specific:V,...",
    )


def most_specific(table: Mapping[Any, S], kind: type, default: S) -> S:
    """The entry of `table` for `kind` or its nearest base class: how every transport reads its
    table of error types, and how exception handlers are chosen."""
    for cls in kind.__mro__:
        if cls in table:
            return table[cls]
    return default
