"""Strict numbers at every door of a real server (REST task routes, Hugging Face API, v2 REST and
gRPC, the repository load's `config`): JSON with non-finite numbers or nested past the limit is
refused by the parser with the API's 4xx; `top_k` is an integer in every API (no 5.0, "5", true);
v2 tensor data hold values of their datatype (no null, booleans or strings for numbers); and an
answer never holds NaN or Infinity, which are not JSON."""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import numpy as np
import pytest

from contract.strict_json import MAX_JSON_DEPTH
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.repository_servers import CONTROL_HEADERS, start_repository_server

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

# Each is a JSON value that a lax parser takes (as infinity, NaN or a deep array).
HOSTILE = {
    "1e400": "1e400",
    "-1e400": "-1e400",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "nested 65": "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
    "nested 100000": "[" * 100_000 + "]" * 100_000,
}
TEXT = "paris is the [MASK] of france."


def _strict(text: str) -> Any:
    """What a strict client reads: NaN and Infinity are not JSON."""

    def refuse(literal: str) -> Any:
        raise AssertionError(f"the answer holds {literal}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    """Explicit model control (the repository load call), both models loaded, gRPC on."""
    return start_repository_server(start_server, model_control="explicit", load_model="tiny-vision,tiny-mlm")


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Any:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}")
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _v2_text(parameters: str) -> str:
    """A v2 request of one text whose `parameters` are the given JSON text."""
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXT]}
    return f'{{"inputs": [{json.dumps(tensor)}], "parameters": {parameters}}}'


# Every JSON door: (path, body with the hostile value at X where the schema takes any value, or a
# number, the API's status for an invalid request, its error shape: "rest" {"error": {"code",
# "message", "details"}}, "message" {"error": "..."}).
DOORS = {
    "fill-mask": ("/fill-mask", f'{{"text": "{TEXT}", "top_k": X}}', 422, "rest"),
    "classify JSON": ("/classify", '{"image": X}', 422, "rest"),
    "hf": ("/models/tiny-mlm", f'{{"inputs": "{TEXT}", "parameters": {{"top_k": X}}}}', 422, "message"),
    "v2 infer parameters": ("/v2/models/tiny-mlm/infer", _v2_text('{"anything": X}'), 400, "message"),
    "v2 infer data": (
        "/v2/models/tiny-mlm/infer",
        '{"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [X]}]}',
        400,
        "message",
    ),
    "v2 load body": ("/v2/repository/models/tiny-mlm/load", '{"parameters": {"other": X}}', 400, "message"),
    "v2 load config": (
        "/v2/repository/models/tiny-mlm/load",
        '{"parameters": {"config": %s}}',  # the config is a string holding JSON: X inside it
        400,
        "message",
    ),
}


@pytest.mark.parametrize("value", list(HOSTILE.values()), ids=list(HOSTILE))
@pytest.mark.parametrize("door", list(DOORS))
def test_non_finite_numbers_and_deep_nesting_are_refused_at_every_json_door(
    server: RunningServer, door: str, value: str
) -> None:
    path, template, status, shape = DOORS[door]
    if door == "v2 load config":
        body = template % json.dumps(
            '{"version_policy": {"latest": {"num_versions": X}}}'.replace("X", value)
        )
    else:
        body = template.replace("X", value)
    with server.client() as client:
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    if shape == "rest":  # refused by the parser, not by a schema that happens to want another type
        assert error["code"] == "invalid_request" and error["details"][0]["type"] == "json_invalid"
        error = error["message"]
    assert "JSON (RFC 8259)" in error and len(error) < 1000


def test_the_repository_load_config_over_grpc_is_parsed_strictly(server: RunningServer, stub: Any) -> None:
    metadata = tuple(CONTROL_HEADERS.items())
    for value in HOSTILE.values():
        config = f'{{"version_policy": {{"latest": {{"num_versions": {value}}}}}}}'
        request = pb.RepositoryModelLoadRequest(model_name="tiny-mlm")
        request.parameters["config"].string_param = config
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryModelLoad(request, metadata=metadata, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "JSON (RFC 8259)" in refused.value.details()


TOP_K_FORMS = {"float": 5.0, "bool": True, "string": "5"}


@pytest.mark.parametrize("form", list(TOP_K_FORMS))
def test_top_k_is_an_integer_in_every_api(server: RunningServer, stub: Any, form: str) -> None:
    """Each API refuses 5.0, true and "5" where it answers 5, in its own error shape."""
    value = TOP_K_FORMS[form]
    with server.client() as client:
        for accepted, expected in ((5, 200), (value, None)):
            answers = {
                "fill-mask": client.post("/fill-mask", json={"text": TEXT, "top_k": accepted}),
                "hf": client.post(
                    "/models/tiny-mlm", json={"inputs": TEXT, "parameters": {"top_k": accepted}}
                ),
                "v2": client.post(
                    "/v2/models/tiny-mlm/infer", content=_v2_text(json.dumps({"top_k": accepted}))
                ),
            }
            for api, response in answers.items():
                want = expected or {"v2": 400}.get(api, 422)
                assert response.status_code == want, (api, response.text[:300])
                if expected is None:
                    assert "integer" in response.text, (api, response.text[:300])
            if expected == 200:
                assert len(answers["fill-mask"].json()["predictions"][0]) == 5
                assert len(answers["hf"].json()) == 5
    request = pb.ModelInferRequest(model_name="tiny-mlm")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(TEXT.encode())
    parameter = request.parameters["top_k"]
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, metadata=tuple(CONTROL_HEADERS.items()), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "integer" in refused.value.details()


@pytest.mark.parametrize(
    "query",
    ["5.0", "true", "%D9%A5", "+5", "%205", "", "1e1", "0x5", "5" * 40],
    ids=lambda q: q[:8] or "empty",
)
def test_a_query_top_k_is_decimal_digits(
    server: RunningServer, cifar_images: list[bytes], query: str
) -> None:
    with server.client() as client:
        good = client.post(
            "/classify?top_k=3", content=cifar_images[0], headers={"content-type": "image/png"}
        )
        bad = client.post(
            f"/classify?top_k={query}", content=cifar_images[0], headers={"content-type": "image/png"}
        )
    assert good.status_code == 200 and len(good.json()["predictions"]) == 3
    assert bad.status_code == 422 and "an integer is expected" in bad.json()["error"]["message"]


# An element of the wrong kind at index 1 of an INT64 tensor: what numpy would take silently.
WRONG_ELEMENTS = {"null": None, "true": True, "string": "5", "decimal": 1.5, "object": {}, "nested": [[2]]}


@pytest.mark.parametrize("kind", list(WRONG_ELEMENTS))
def test_tensor_data_of_the_wrong_kind_are_refused_naming_the_element(
    server: RunningServer, kind: str
) -> None:
    def request(second: Any) -> dict[str, Any]:
        ids = {"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [101, second, 102]}
        positions = {"name": "mask_positions", "shape": [1, 1], "datatype": "INT64", "data": [1]}
        return {"inputs": [ids, positions]}

    with server.client() as client:
        good = client.post("/v2/models/tiny-mlm/infer", json=request(103))
        bad = client.post("/v2/models/tiny-mlm/infer", json=request(WRONG_ELEMENTS[kind]))
    assert good.status_code == 200, good.text[:300]
    assert bad.status_code == 400, bad.text[:300]
    message = bad.json()["error"]
    assert "input input_ids" in message and ("element 1 is" in message or "nested unevenly" in message)


def test_null_in_a_float_tensor_is_refused_not_run_as_nan(server: RunningServer) -> None:
    shape = _vision_shape(server)
    data: list[Any] = [0.0] * int(np.prod(shape))
    data[7] = None
    body = {"inputs": [{"name": "pixel_values", "shape": shape, "datatype": "FP32", "data": data}]}
    with server.client() as client:
        response = client.post("/v2/models/tiny-vision/infer", json=body)
    assert response.status_code == 400 and "element 7 is null" in response.json()["error"]


def _vision_shape(server: RunningServer) -> list[int]:
    with server.client() as client:
        meta = client.get("/v2/models/tiny-vision").json()
    dims = next(t["shape"] for t in meta["inputs"] if t["name"] == "pixel_values")
    return [1, *dims[1:]]


def test_non_finite_outputs_are_null_in_json_and_exact_in_binary(server: RunningServer) -> None:
    """NaN pixels (binary input: JSON cannot carry them) make NaN logits: the JSON answer is valid
    JSON with null there; asked as binary, the exact NaNs come back."""
    shape = _vision_shape(server)
    pixels = np.full(shape, np.nan, dtype=np.float32)
    pixels[0, 0, 0, 0] = np.inf
    blob = pixels.tobytes()
    for binary in (False, True):
        head = {
            "inputs": [
                {
                    "name": "pixel_values",
                    "shape": shape,
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": binary}}],
        }
        raw = json.dumps(head).encode()
        headers = {
            "Inference-Header-Content-Length": str(len(raw)),
            "content-type": "application/octet-stream",
        }
        response = httpx.post(
            f"{server.url}/v2/models/tiny-vision/infer",
            content=raw + blob,
            headers={**headers, **CONTROL_HEADERS},
            timeout=30,
        )
        assert response.status_code == 200, response.text[:300]
        length = int(response.headers.get("Inference-Header-Content-Length", len(response.content)))
        answer = _strict(response.content[:length].decode())
        (output,) = answer["outputs"]
        if binary:
            values = struct.unpack(
                f"<{output['parameters']['binary_data_size'] // 4}f", response.content[length:]
            )
            assert any(v != v for v in values)  # NaN, exactly as computed
        else:
            assert output["data"] and all(v is None or isinstance(v, float) for v in output["data"])
            assert None in output["data"]
