"""The answer-size bounds hold for any tensor, and the sliced JSON is the standard JSON.

Property tests over every datatype: the JSON the REST transport writes for an output is exactly
`json.dumps` of its data, no longer than `json_bytes` says; the raw form is exactly `raw_bytes`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import service.v2.rest as rest_module
from contract.tensors import NUMPY_TYPES, Tensor, bytes_tensor
from service.v2.inference import JSON_ELEMENT_BYTES, answer_size, check_answer, json_bytes, raw_bytes
from service.v2.rest import answer_json, json_data

NUMERIC = sorted(JSON_ELEMENT_BYTES)


@st.composite
def numeric_tensors(draw: st.DrawFn) -> Tensor:
    datatype = draw(st.sampled_from(NUMERIC))
    array = draw(hnp.arrays(NUMPY_TYPES[datatype], hnp.array_shapes(min_dims=1, max_dims=3, max_side=6)))
    return Tensor("out", datatype, array)


@st.composite
def bytes_tensors(draw: st.DrawFn) -> Tensor:
    items = draw(st.lists(st.binary(max_size=40), min_size=1, max_size=6))
    return bytes_tensor("out", items)


@settings(max_examples=300, deadline=None)
@given(st.one_of(numeric_tensors(), bytes_tensors()))
# Non-finite floats, whichever slice they fall in: JSON has no Infinity or NaN (written as null).
@example(Tensor("out", "FP16", np.array([np.inf], dtype=np.float16)))
@example(Tensor("out", "FP32", np.array([1.0, -np.inf, np.nan] * 3000, dtype=np.float32)))
def test_the_json_is_standard_and_within_its_bound(tensor: Tensor) -> None:
    text = json_data(tensor)
    assert text == json.dumps(tensor.json_data(), separators=(",", ":"))
    assert len(text.encode()) <= json_bytes(tensor)
    assert raw_bytes(tensor) == len(tensor.raw())


@pytest.mark.parametrize("datatype", NUMERIC)
def test_the_widest_elements_fit_the_per_element_bound(datatype: str) -> None:
    dtype = NUMPY_TYPES[datatype]
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [info.min, info.max, info.tiny, -info.tiny, info.smallest_subnormal, np.nan, -np.inf, 1 / 3]
    elif dtype.kind == "b":
        values = [False, True]
    else:
        values = [np.iinfo(dtype).min, np.iinfo(dtype).max]
    tensor = Tensor("out", datatype, np.array(values, dtype=dtype))
    assert len(json_data(tensor)) <= json_bytes(tensor)


def test_slices_join_into_one_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest_module, "SLICE_ELEMENTS", 3)
    tensor = Tensor("logits", "FP32", np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5))
    raw = Tensor("ids", "INT64", np.arange(6, dtype=np.int64))
    head = {"model_name": "m", "model_version": "1"}
    document = answer_json(
        head, [tensor, raw], lambda t: {"binary_data_size": 48} if t.name == "ids" else None
    )
    expected = {
        **head,
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [4, 5], "data": tensor.json_data()},
            {"name": "ids", "datatype": "INT64", "shape": [6], "parameters": {"binary_data_size": 48}},
        ],
    }
    assert document == json.dumps(expected, separators=(",", ":")).encode()


def test_each_limit_is_checked_on_its_own_part() -> None:
    tensor = Tensor("logits", "FP32", np.zeros((100, 100), np.float32))
    as_json = answer_size([tensor], lambda name: False)
    as_raw = answer_size([tensor], lambda name: True)
    assert as_raw.raw == 40_000 and as_json.raw == 0 and as_json.json > 100 * 100 * 20
    check_answer(as_raw, max_json=2048, max_raw=40_000)
    with pytest.raises(Exception, match="max_binary_response_bytes"):
        check_answer(as_raw, max_json=2048, max_raw=39_999)
    with pytest.raises(Exception, match="binary_data_output"):
        check_answer(as_json, max_json=as_json.json - 1, max_raw=10**9)
