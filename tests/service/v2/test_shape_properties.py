"""Property test: no v2 shape, however absurd (huge, zero, negative dimensions, more of them than
numpy takes, an empty tensor whose other dimensions overflow int64), makes the server fail. Over
REST and gRPC, against a real server, every such request is answered 400 / INVALID_ARGUMENT with
a message, never 500 / INTERNAL; and the server still answers a good request afterwards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.tensors import MAX_DIMS, MAX_ELEMENTS
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(300)

INT64 = 2**63 - 1
# Dimensions near every edge: zero, small, the element limit, int64's and beyond (REST only).
DIMENSION = st.one_of(
    st.sampled_from([0, 1, 2, 3, 32, MAX_ELEMENTS, MAX_ELEMENTS + 1, 2**32, 2**62, INT64]),
    st.integers(min_value=0, max_value=64),
    st.integers(min_value=-(2**63), max_value=-1),
)
SHAPES = st.lists(DIMENSION, max_size=80) | st.lists(
    st.sampled_from([0, 1, 2**40]), min_size=MAX_DIMS, max_size=80
)
REST_SHAPES = SHAPES | st.lists(DIMENSION | st.sampled_from([2**64, 10**30, -(2**64)]), max_size=8)
DATA = st.sampled_from([[], [0.0], [0.0] * 3])
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    from support.servers import free_port

    return start_server(grpc_port=free_port())


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Any:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}")
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Any:
    with server.client() as client:
        yield client


def _good(http: httpx.Client) -> None:
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a [MASK] day"]}
    assert http.post("/v2/models/tiny-mlm/infer", json={"inputs": [tensor]}).status_code == 200


@SETTINGS
@given(shape=REST_SHAPES, data=DATA, datatype=st.sampled_from(["FP32", "INT64", "BYTES"]))
def test_any_shape_over_rest_is_a_400(
    http: httpx.Client, shape: list[int], data: list[Any], datatype: str
) -> None:
    values = ["x"] * len(data) if datatype == "BYTES" else data
    tensor = {"name": "pixel_values", "shape": shape, "datatype": datatype, "data": values}
    response = http.post("/v2/models/tiny-vision/infer", json={"inputs": [tensor]})
    assert response.status_code == 400, response.text[:300]
    assert len(response.json()["error"]) > 10


@SETTINGS
@given(shape=SHAPES, raw=st.booleans(), datatype=st.sampled_from(["FP32", "INT64", "BYTES"]))
def test_any_shape_over_grpc_is_invalid_argument(
    stub: Any, shape: list[int], raw: bool, datatype: str
) -> None:
    request = pb.ModelInferRequest(model_name="tiny-vision")
    tensor = request.inputs.add(name="pixel_values", datatype=datatype, shape=shape)
    if raw:
        request.raw_input_contents.append(b"")
    elif datatype == "FP32":
        tensor.contents.fp32_contents.extend([0.0, 1.0])
    elif datatype == "INT64":
        tensor.contents.int64_contents.extend([0, 1])
    else:
        tensor.contents.bytes_contents.extend([b"x"])
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()


def test_the_issues_examples_and_the_limits_themselves(http: httpx.Client, stub: Any) -> None:
    """[2^64, 0], 70 dimensions, and the limits exactly: MAX_DIMS dimensions and MAX_ELEMENTS pass
    the shape check (refused later, for the model's shape), one more does not."""
    cases = {
        "2^64 x 0": ([2**64, 0], "is refused"),
        "70 dimensions": ([1] * 70, "is refused"),
        "limit + 1 dimensions": ([1] * (MAX_DIMS + 1), "is refused"),
        "elements + 1": ([MAX_ELEMENTS + 1, 0], "is refused"),
        "at the dimension limit": ([0] + [1] * (MAX_DIMS - 1), "must have shape"),
        "at the element limit": ([0, MAX_ELEMENTS], "must have shape"),
    }
    for name, (shape, says) in cases.items():
        tensor = {"name": "pixel_values", "shape": shape, "datatype": "FP32", "data": []}
        response = http.post("/v2/models/tiny-vision/infer", json={"inputs": [tensor]})
        assert response.status_code == 400, (name, response.text[:300])
        message = response.json()["error"]
        # REST's schema states the limits (less than or equal / at most N items) before the shape check.
        assert says in message or "less than or equal" in message or "at most" in message, (name, message)
        if max(shape) <= 2**63 - 1:
            request = pb.ModelInferRequest(model_name="tiny-vision")
            request.inputs.add(name="pixel_values", datatype="FP32", shape=shape)
            request.raw_input_contents.append(b"")
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
            assert (
                refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
            )
    _good(http)
