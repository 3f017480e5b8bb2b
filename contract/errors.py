"""Transport-free errors: what went wrong, as a stable machine code and a message that says what is
accepted. Each transport maps these *types* to its own status codes in one table (REST task
routes: `service.http.errors`; Hugging Face API: `service.http.hf`; Open Inference Protocol v2:
`service.v2.rest`; gRPC: `service.v2.grpc_server`), read with `most_specific`, as Hugging Face
text-embeddings-inference maps its core errors in its router; nothing below the transports chooses
a status code.

`UserError` is different: a problem with what an operator handed a command (a checkpoint, a model
repository, a setting). The CLI prints its message and exits non-zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

S = TypeVar("S")


class UserError(ValueError):
    """A file, directory or setting given to a command cannot be used; the message says how to fix it.

    A ValueError, so that code which validates values keeps working; the CLI catches this type only."""


class RequestError(Exception):
    """Base of everything a request can be refused for."""

    def __init__(self, code: str, message: str, *, details: list[Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class InvalidInput(RequestError):
    """The request is malformed or does not fit the model (not an image, no [MASK], bad top_k...)."""


class InputTooLarge(RequestError):
    """The input is over a size limit (bytes, pixels)."""


class UnsupportedMediaType(RequestError):
    """The payload is in an encoding the endpoint does not read."""


class ModelNotFound(RequestError):
    """No served model has that name (or no model of that task is served)."""


class Unavailable(RequestError):
    """The service cannot take the request now; retrying later may succeed."""

    retry_after_s: int | None = 1


class Overloaded(Unavailable):
    """The model's queue is full: load is shed at once rather than letting latency grow."""


class NotReady(Unavailable):
    """The models are loading, failed to load, or the service is shutting down."""

    def __init__(self, code: str, message: str, *, retry_after_s: int | None = 1) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s


class Closed(Unavailable):
    """The model stopped accepting requests (shutting down)."""


class DeadlineExceeded(RequestError):
    """The request did not complete within its deadline."""


class ClientGone(RequestError):
    """The client disconnected before the answer was ready (nothing is sent; metrics count it)."""


def most_specific(table: Mapping[Any, S], error: BaseException, default: S) -> S:
    """The entry of `table` for the closest class of `error` (its own, else the nearest base):
    how every transport reads its table of error types, and how exception handlers are chosen."""
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    return default


__all__ = [
    "most_specific",
    "UserError",
    "RequestError",
    "InvalidInput",
    "InputTooLarge",
    "UnsupportedMediaType",
    "ModelNotFound",
    "Unavailable",
    "Overloaded",
    "NotReady",
    "Closed",
    "DeadlineExceeded",
    "ClientGone",
]
