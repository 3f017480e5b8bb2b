"""Reading a request: what the task routes' requests may be (their query and body schemas, each
limit declared where OpenAPI states it), and how any request is read: its content type, query, JSON
body and image.

Bodies are parsed here rather than by FastAPI's `File`/`Body` parameters because FastAPI turns any
error raised while reading a body into a bare 400; we want 413 for too large, 415 for a wrong
content type and 422 for bad JSON, each with a message that says what is accepted. Every JSON body
of every API is parsed by `json_body` (the strict parser of `contract.strict_json`: finite
numbers, bounded nesting) and then validated as a Python document, so that no door accepts what
another refuses.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, BeforeValidator, Field, Strict, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from python_multipart.multipart import parse_options_header

from contract import strict_json
from contract.errors import ErrorCode, InvalidInput, MalformedRequest, UnsupportedMediaType
from contract.formats import MASK_TOKEN, MAX_FILL_MASK_TOP_K
from contract.image import ACCEPTED_DESCRIPTION, decode_base64
from contract.messages import echo
from service.http.errors import validation_error
from service.http.schemas import examples

M = TypeVar("M", bound=BaseModel)

# Request limits, each checked where it is declared (the schemas below), so OpenAPI states them.
MAX_TEXT_LENGTH = 100_000  # characters of a fill-mask text (the model's token window is checked later)
MAX_TARGETS = 1000
MAX_TARGET_LENGTH = 100  # characters of one target word
MAX_BOUNDARY = 70  # characters of a multipart boundary (RFC 2046)
Target = Annotated[str, Field(min_length=1, max_length=MAX_TARGET_LENGTH)]
Targets = Annotated[list[Target], Field(min_length=1, max_length=MAX_TARGETS)]
# What `base64.b64decode(validate=True)` accepts, optionally behind a data: URL header.
BASE64_PATTERN = r"^(data:[^,]*;base64,)?([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# A text is refused without one (the codec checks the tokens; this states it in the schema).
MASK_PATTERN = r"\[MASK\]"
# Integers are strict in every API: a JSON integer (not 5.0, "5" or true, which pydantic's lax mode
# would turn into 5 or 1), and in a query string decimal ASCII digits (not "5.0", "true" or "٥"), as
# gRPC's typed parameters are.
JSON_INTEGER = 'a JSON integer is expected (5, not 5.0, "5" or true)'


def json_integer(value: Any) -> Any:
    """A JSON integer as it is; anything else (a float even when integral, which JSON Schema's
    `integer` would let through, a string, a boolean) refused with its own error type."""
    if type(value) is not int:
        raise PydanticCustomError("json_integer", JSON_INTEGER)
    return value


# A JSON integer's constraints go before its validator, so that the JSON schema states them.
TopK = Annotated[int, Field(ge=1, le=MAX_FILL_MASK_TOP_K), BeforeValidator(json_integer)]
_DIGITS = re.compile(r"-?[0-9]{1,18}")  # any int64


def _query_int(value: Any) -> Any:
    """A query string's integer: an optional minus and up to 18 ASCII digits."""
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise PydanticCustomError("int_parsing", "an integer is expected (decimal digits, e.g. 5)")
        return int(value)
    return value


QueryInt = Annotated[int, Strict(), BeforeValidator(_query_int)]
# A 1x1 PNG: an example request that really works.
TINY_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGM4IScHAAK2AQU0pnWqAAAAAElFTkSuQmCC"
)


class ClassifyQuery(BaseModel):
    """The query string of /classify."""

    top_k: QueryInt = Field(5, ge=1, description="number of labels to return (at most the number of labels)")
    model: str | None = Field(None, description="served model name; default: the service's classifier")


class ClassifyJSONRequest(BaseModel):
    """/classify with a JSON body: the image base64-encoded (plain or as a `data:` URL)."""

    model_config = examples({"image": TINY_PNG_BASE64}, extra="forbid")
    image: str = Field(
        min_length=1,
        pattern=BASE64_PATTERN,
        description="the image file, base64-encoded (standard alphabet, padded); a data: URL is accepted",
    )


class FillMaskRequest(BaseModel):
    model_config = examples({"text": "paris is the [MASK] of france.", "top_k": 5}, extra="forbid")
    text: str = Field(
        min_length=1,
        max_length=MAX_TEXT_LENGTH,
        json_schema_extra={"pattern": MASK_PATTERN},
        description="text with one or more [MASK] tokens (at most the model's window of tokens)",
    )
    top_k: TopK = Field(5, description="predictions per [MASK]")
    targets: Targets | None = Field(
        None,
        description="restrict the candidates to these words; a word that is not one vocabulary token is "
        "replaced by its first wordpiece (as Hugging Face's fill-mask pipeline does)",
    )
    model: str | None = Field(None, description="served model name; default: the service's fill-mask model")

    @field_validator("text")
    @classmethod
    def _has_mask(cls, text: str) -> str:
        """The schema's `pattern`, checked with a message that says what to do."""
        if MASK_TOKEN not in text:
            raise ValueError(f"the text contains no {MASK_TOKEN} token; put one where a word is missing")
        return text


# Content types that say nothing about a raw body: none, generic bytes, and curl's default for
# `--data-binary` (which is not a form here). Such bodies are read for what they are (an image is
# recognised from its bytes, v2 JSON parsed), as Triton does.
RAW_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")


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


def unsupported_media_type(got: str | None, accepted: str) -> UnsupportedMediaType:
    return UnsupportedMediaType(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE, f"content type {echo(got or '(none)')} is not accepted; {accepted}"
    )


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_image(request: Request) -> bytes:
    """The image of a /classify request: multipart field `file`, the raw body (image/*, octet-stream or
    no content type), or JSON `{"image": "<base64>"}` (for clients that only speak JSON)."""
    mime = media_type(request)
    if mime == "multipart/form-data":
        check_boundary(request.headers.get("content-type", ""))
        # max_part_size bounds the non-file fields; the body limit bounds the file.
        async with request.form(max_files=1, max_fields=16) as form:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise InvalidInput(
                    ErrorCode.MISSING_FILE,
                    "the multipart upload needs the image in a file field named 'file'",
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
        raise InvalidInput(ErrorCode.EMPTY_IMAGE, f"the image is empty; send a {ACCEPTED_DESCRIPTION} file")
    return data


def check_boundary(content_type: str) -> None:
    """A multipart boundary of 1 to `MAX_BOUNDARY` characters (RFC 2046, 5.1.1), else 400: the
    parser searches every byte of the body for it, so a long one multiplies the work of a body
    (BentoML's CVE-2024-9056); the form parser says what else is wrong with one."""
    boundary = parse_options_header(content_type)[1].get(b"boundary", b"")
    if len(boundary) > MAX_BOUNDARY:
        raise MalformedRequest(
            ErrorCode.BAD_REQUEST,
            f"the multipart boundary is {len(boundary)} characters; at most {MAX_BOUNDARY} are accepted "
            "(RFC 2046)",
        )


async def read_json(request: Request, schema: type[M]) -> M:
    """Validate a JSON body against `schema`; 415 for another content type, 422 for bad JSON."""
    mime = media_type(request)
    if mime != "application/json" and not mime.endswith("+json"):
        raise unsupported_media_type(mime, "send a JSON body with content type application/json")
    body = await request.body()
    if not body:
        raise InvalidInput(ErrorCode.EMPTY_BODY, "the body is empty; send a JSON object")
    return json_body(body, schema, "the JSON body")


def json_body(raw: bytes, schema: type[M], where: str) -> M:
    """The JSON document `raw`, parsed strictly (`contract.strict_json`) and validated against
    `schema` (`validated`); a parse error is InvalidInput `invalid_request` saying what is wrong
    and where, as a schema's refusal does."""
    try:
        document = strict_json.loads(raw)
    except strict_json.JSONError as exc:
        details = [{"loc": list(exc.loc), "msg": exc.message, "type": "json_invalid"}]
        raise InvalidInput(
            ErrorCode.INVALID_REQUEST, f"{where} is invalid: {exc.message}", details=details
        ) from None
    return validated(schema, document, where)


def validated(schema: type[M], document: Any, where: str) -> M:
    """`document` (parsed by `json_body`) validated against `schema`; 422 `invalid_request`."""
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        raise validation_error(list(exc.errors()), where) from None
