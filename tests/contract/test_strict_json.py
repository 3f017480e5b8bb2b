"""The strict JSON parser of every JSON door: what RFC 8259 allows parses as the standard library
reads it; a non-finite number (a literal, or a number that overflows a double) and nesting past
the limit are refused, with where."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.strict_json import MAX_JSON_DEPTH, JSONError, loads

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def _nested(depth: int, leaf: str = "1") -> str:
    """`depth` arrays around `leaf`, alternately arrays and objects."""
    text = leaf
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k": {text}}}'
    return text


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS)
def test_every_finite_document_parses_as_the_standard_library_reads_it(document: Any) -> None:
    text = json.dumps(document)
    assert loads(text) == json.loads(text) and loads(text.encode()) == json.loads(text)


@settings(max_examples=200, deadline=None)
@given(
    DOCUMENTS, st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1" + "0" * 400 + ".5"])
)
def test_a_non_finite_number_anywhere_is_refused_where_it_is(document: Any, number: str) -> None:
    """The number replaces the first leaf (or wraps the document): the error says where, or for the
    literals what (the parser stops at them)."""
    text = json.dumps({"doc": document, "bad": [0, "__N__"]}).replace('"__N__"', number)
    with pytest.raises(JSONError) as refused:
        loads(text)
    if number[0].isdigit() or number.startswith("-1"):
        assert refused.value.loc == ("bad", 1) and "bad[1]" in refused.value.message
    assert "finite" in refused.value.message


def test_nesting_up_to_the_limit_parses_and_past_it_is_refused() -> None:
    assert loads(_nested(MAX_JSON_DEPTH)) is not None
    for depth in (MAX_JSON_DEPTH + 1, 300, 100_000):
        with pytest.raises(JSONError, match=f"nested more than {MAX_JSON_DEPTH} deep"):
            loads(_nested(depth))


@pytest.mark.parametrize(
    "text",
    ['"\\ud800"', "[1,]", "\ufeff[1]", "{'a': 1}", "1" * 5000, "[1] [2]", b'"\xff"'],
    ids=[
        "lone surrogate",
        "trailing comma",
        "BOM",
        "single quotes",
        "5000 digits",
        "two documents",
        "not UTF-8",
    ],
)
def test_what_rfc_8259_does_not_allow_is_refused(text: str | bytes) -> None:
    with pytest.raises(JSONError, match="not valid JSON"):
        loads(text)


def test_a_long_or_odd_key_is_shortened_in_the_message() -> None:
    key = "x\n" + "y" * 1000
    with pytest.raises(JSONError) as refused:
        loads('{{"{}": 1e400}}'.format(key.replace("\n", "\\n")))
    assert len(refused.value.message) < 300 and "\n" not in refused.value.message
