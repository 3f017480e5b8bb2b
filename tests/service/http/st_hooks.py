"""A schemathesis check of our own, loaded by test_openapi.py's run (`hooks` in its config).

JSON Schema cannot say "a decodable JPEG", "at most 32 tokens" or "the input names of this
model", so the content operations may refuse a schema-valid request (REST 422, v2 400) for such a
reason; test_openapi.py lets positive_data_acceptance expect those statuses there. This check keeps
that allowance honest: a schema-valid request must never be refused by *validation* (a pydantic
error, a missing field, an empty body), because every constraint a validator checks is one the
schema could have stated, and then the schema lied. REST refusals carry a machine code, which
must be one of `SEMANTIC_CODES`; v2 and HF refusals must not be validation messages. One
validation refusal is allowed: an integer written as a decimal (5.0), which JSON Schema's
`integer` accepts and every API refuses (service.http.parsing.JSON_INTEGER: integers are strict everywhere).
"""

from __future__ import annotations

from typing import Any

import schemathesis

# The REST refusals a schema cannot state (each needs the model, its tokenizer or an image decoder);
# any other code for a schema-valid request means the schema left out a constraint.
SEMANTIC_CODES = {
    "invalid_image",  # not a decodable image
    "empty_image",  # a binary body of zero bytes (a binary schema has no length)
    "image_too_large",  # pixels, known only after reading the image header
    "invalid_top_k",  # more labels than the model has
    "wrong_task",  # a served model of the other task
    "no_mask",  # "[MASK]" is in the text but tokenizes differently
    "too_many_masks",  # more [MASK] tokens than the model predicts
    "text_too_long",  # more tokens than the model's window
    "invalid_target",  # a word that tokenizes to nothing
}
# The v2 and HF bodies carry only a message: these mark refusals by validation.
VALIDATION_MESSAGES = ("is invalid: ", "the body is empty")
# The start of service.http.parsing.JSON_INTEGER (this hook runs in schemathesis' process, which
# does not import the service).
JSON_INTEGER = "a JSON integer is expected"


def _only_strict_integers(code: str | None, message: str, error: Any) -> bool:
    """Whether every reason of a validation refusal is an integral decimal where a JSON integer is
    expected, the one constraint JSON Schema cannot state."""
    if code is not None:
        details = error.get("details") or []
        return (
            code == "invalid_request"
            and bool(details)
            and all(d.get("type") == "json_integer" for d in details)
        )
    reasons = message.partition("is invalid: ")[2].split("; ")
    return all(JSON_INTEGER in reason for reason in reasons)


@schemathesis.check
def refused_only_for_what_the_schema_cannot_say(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return None
    if case.media_type not in (None, "application/json"):
        return None  # binary bodies: the schema says "bytes", which any refusal is consistent with
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    code, message = (
        (error.get("code"), error.get("message", "")) if isinstance(error, dict) else (None, error)
    )
    if _only_strict_integers(code, str(message), error):
        return None
    if (code is not None and code not in SEMANTIC_CODES) or any(
        part in str(message) for part in VALIDATION_MESSAGES
    ):
        raise AssertionError(
            f"a schema-valid request was refused for a reason the schema could state: {message}"
        )
    return None
