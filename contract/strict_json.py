"""The one JSON parser of every JSON door: request bodies (task routes, the Hugging Face API, v2
REST inference and repository calls), the JSON carried in a parameter (a v2 load's `config`,
over REST and gRPC), and the JSON files a model directory or a command brings (`config.json`, class
names, `policy.json`, a command's `--config`: `loads_written`). One rule everywhere, RFC 8259
without its loopholes:

- numbers are finite: `NaN`, `Infinity` and `-Infinity` are not JSON and are refused, and so is a
  number that is finite in the text but not as a double (`1e400`), which parsers otherwise turn
  into infinity silently; integers have at most 4300 digits;
- nesting is at most `MAX_JSON_DEPTH` (64) arrays and objects deep, far beyond any request of the
  APIs (a v2 body with a 4-D tensor is 7 deep) and far below what could exhaust a stack;
- the text is UTF-8 without lone surrogates (`"\\ud800"`), so every string can be encoded again.

The parser is pydantic-core's (jiter, the parser behind `model_validate_json`, several times faster
than the standard library's), asked to refuse the literals; one pass over the parsed containers then
checks depth and overflowed numbers, so the bodies' schemas validate an ordinary Python document.
A refusal is a `JSONError` naming where in the document the fault is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic_core import from_json

MAX_JSON_DEPTH = 64
ACCEPTED = f"JSON (RFC 8259): finite numbers only, no NaN or Infinity, nesting at most {MAX_JSON_DEPTH} deep"

Loc = tuple[int | str, ...]


class JSONError(ValueError):
    """A document refused by `loads`: `message` says what and what is accepted, `loc` where (the
    keys and indexes from the top, as pydantic's error locations)."""

    def __init__(self, message: str, loc: Loc = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


def loads(data: bytes | str) -> Any:
    """The document in `data`, or JSONError."""
    try:
        document = from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        # jiter's own message names the line and column ("expected value at line 1 column 9" for a
        # NaN); its nesting limit (200) is above ours, so its overflow is ours too.
        reason = str(exc)
        if "recursion limit" in reason:
            reason = f"nested more than {MAX_JSON_DEPTH} deep"
        raise JSONError(f"not valid JSON: {reason}; send {ACCEPTED}") from None
    fault = _fault(document)
    if fault is not None:
        raise _refusal(document, fault)
    return document


def loads_written(data: bytes | str) -> Any:
    """`loads` of a document read from a file (a config, class names, a policy): the same rules,
    and a refusal that says what the file must hold rather than what to send."""
    try:
        return loads(data)
    except JSONError as exc:
        raise JSONError(exc.message.replace("; send ", "; expected "), exc.loc) from None


_NUMBERS = frozenset({int, float})


def _finite(numbers: list[Any]) -> bool:
    """Whether a list of JSON numbers holds no infinite or NaN float. `math.fsum` is inf or NaN when
    an element is (ValueError for inf and -inf together); only when the exact sum of finite
    elements overflows, or an integer is too large for a double, is each float looked at."""
    try:
        return math.isfinite(math.fsum(numbers))
    except (OverflowError, ValueError):
        return all(x - x == 0 for x in numbers if type(x) is float)


def _fault(document: Any) -> str | None:
    """'depth' or 'number' when the document has a container too deep or a non-finite number."""
    stack: list[tuple[Any, int]] = [(document, 1)] if isinstance(document, list | dict) else []
    if isinstance(document, float) and document - document != 0:
        return "number"
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return "depth"
        if type(node) is list and _NUMBERS.issuperset(map(type, node)):
            if not _finite(node):  # a tensor's data: checked at C speed, not number by number
                return "number"
            continue
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is float:
                if item - item != 0:  # inf - inf and nan - nan are nan
                    return "number"
            elif kind is list or kind is dict:
                stack.append((item, depth + 1))
    return None


def _refusal(document: Any, fault: str) -> JSONError:
    """The error for `fault`, located (a second, recursive pass: only refused documents pay for it)."""
    loc = tuple(_short(part) for part in _locate(document, fault, (), 1) or ())
    if fault == "depth":  # the location is as long as the nesting: in `loc` only
        return JSONError(f"the JSON is nested more than {MAX_JSON_DEPTH} deep; send {ACCEPTED}", loc)
    dotted = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    where = f" at {dotted}" if loc else ""
    return JSONError(
        f"the number{where} is not a finite double (JSON numbers must be finite); send {ACCEPTED}", loc
    )


def _locate(node: Any, fault: str, loc: Loc, depth: int) -> Loc | None:
    if isinstance(node, float):
        return loc if fault == "number" and node - node != 0 else None
    if not isinstance(node, list | dict):
        return None
    if fault == "depth" and depth > MAX_JSON_DEPTH:
        return loc
    pairs: Iterable[tuple[int | str, Any]] = node.items() if isinstance(node, dict) else enumerate(node)
    for key, item in pairs:
        found = _locate(item, fault, (*loc, key), depth + 1)
        if found is not None:
            return found
    return None


def _short(part: int | str) -> int | str:
    """A key as echoed in a message: a client's key may be long or hold control characters."""
    if isinstance(part, int):
        return part
    text = part if len(part) <= 32 else part[:32] + "..."
    return text if text.isprintable() else repr(text)
