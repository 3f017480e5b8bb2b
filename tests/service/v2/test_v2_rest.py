"""Open Inference Protocol v2 over REST with the stock clients: tritonclient.http and KServe's SDK.

A real server (uvicorn on 127.0.0.1, the tiny exported models); what the clients send is what they
send to Triton or KServe, unchanged. Answers are checked against /classify and /fill-mask, which
run the same models through the same batchers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from contract.image import ImageTransform
from contract.spec import read_spec

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    from support.servers import free_port

    return start_server(grpc_port=free_port())


@pytest.fixture(scope="module")
def triton(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")


def labels(served: Path) -> list[str]:
    return json.loads((served / "labels.json").read_text())


def top_label(server: RunningServer, image: bytes) -> str:
    with server.client() as client:
        response = client.post("/classify", params={"top_k": 1}, content=image)
    assert response.status_code == 200, response.text
    return response.json()["predictions"][0]["label"]


def pixels(served: Path, image: bytes) -> np.ndarray:
    spec = read_spec(served)
    assert spec is not None
    return ImageTransform.from_config(spec.config["preprocessing"], 10**8, (32, 32))(image)


def test_health_and_metadata(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny-vision") and triton.is_model_ready("tiny-mlm", model_version="1")
    server = triton.get_server_metadata()
    assert server["name"] == "gmlp-serve" and server["extensions"] == [
        "binary_tensor_data",
        "model_configuration",
        "statistics",
        "model_repository",
    ]
    # The model's name lists the graph's tensors, NAME-ensemble the encoded input; both list every output.
    vision = triton.get_model_metadata("tiny-vision")
    assert vision["versions"] == ["1"] and vision["inputs"] == [
        {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, 32, 32]},
    ]
    vision_bytes = triton.get_model_metadata("tiny-vision-ensemble", model_version="1")
    assert vision_bytes["name"] == "tiny-vision-ensemble" and vision_bytes["versions"] == ["1"]
    assert vision_bytes["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
    assert vision_bytes["outputs"] == vision["outputs"]
    assert triton.is_model_ready("tiny-vision-ensemble") and triton.is_model_ready("tiny-mlm-ensemble", "1")
    mlm = triton.get_model_metadata("tiny-mlm", model_version="1")
    # A text's length and its number of masks are dynamic axes of the graph: -1.
    assert [(t["name"], t["shape"]) for t in mlm["inputs"]] == [
        ("input_ids", [-1, -1]),
        ("mask_positions", [-1, -1]),
    ]
    mlm_bytes = triton.get_model_metadata("tiny-mlm-ensemble")
    assert [(t["name"], t["shape"]) for t in mlm_bytes["inputs"]] == [("text", [-1, 1])]
    for meta in (mlm, mlm_bytes):
        assert [t["name"] for t in meta["outputs"]] == ["logits", "topk_ids", "topk_scores", "predictions"]
    with pytest.raises(InferenceServerException) as missing:
        triton.get_model_metadata("tiny-vision", model_version="7")
    assert missing.value.status() == "404" and "has no version '7'" in missing.value.message()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_raw_tensors_json_and_binary(
    server: RunningServer,
    triton: httpclient.InferenceServerClient,
    cifar_images: list[bytes],
    tiny_vision_served: Path,
    binary: bool,
) -> None:
    batch = np.stack([pixels(tiny_vision_served, image) for image in cifar_images[:3]])
    tensor = httpclient.InferInput("pixel_values", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch, binary_data=binary)
    requested = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    result = triton.infer("tiny-vision", [tensor], outputs=requested, request_id=f"raw-{binary}")
    logits = result.as_numpy("logits")
    assert logits.shape == (3, 10) and logits.dtype == np.float32
    response = result.get_response()
    assert response["id"] == f"raw-{binary}" and response["model_name"] == "tiny-vision"
    assert ("data" in response["outputs"][0]) is not binary
    names = labels(tiny_vision_served)
    assert [names[i] for i in logits.argmax(axis=1)] == [top_label(server, im) for im in cifar_images[:3]]
    # No outputs named: the client asks for every output in binary (binary_data_output).
    everything = triton.infer("tiny-vision", [tensor])
    np.testing.assert_allclose(everything.as_numpy("logits"), logits, rtol=0, atol=1e-5)


def test_bytes_image_input_uses_the_services_preprocessing(
    server: RunningServer,
    triton: httpclient.InferenceServerClient,
    cifar_images: list[bytes],
    tiny_vision_served: Path,
) -> None:
    images = cifar_images[3:7]
    tensor = httpclient.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object))  # binary: JPEG bytes are not UTF-8
    logits = triton.infer("tiny-vision", [tensor]).as_numpy("logits")
    names = labels(tiny_vision_served)
    assert [names[i] for i in logits.argmax(axis=1)] == [top_label(server, image) for image in images]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bytes_text_input_returns_the_fill_mask_predictions(
    server: RunningServer, triton: httpclient.InferenceServerClient, binary: bool
) -> None:
    texts = ["the [MASK] sat on the mat.", "a [MASK] day and a [MASK] night"]
    tensor = httpclient.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    requested = [httpclient.InferRequestedOutput("predictions", binary_data=binary)]
    result = triton.infer("tiny-mlm", [tensor], outputs=requested, parameters={"top_k": 3})
    got = [json.loads(item) for item in result.as_numpy("predictions")]
    with server.client() as client:
        expected = [
            client.post("/fill-mask", json={"text": t, "top_k": 3}).json()["predictions"] for t in texts
        ]
    assert got == expected and [len(p) for p in got] == [1, 2]


def test_errors_reach_the_client_with_the_servers_message(
    triton: httpclient.InferenceServerClient, cifar_images: list[bytes]
) -> None:
    image = httpclient.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([cifar_images[0]], dtype=object))
    wrong = httpclient.InferInput("pixel_values", [1, 3, 16, 16], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 16, 16), np.float32))
    not_an_image = httpclient.InferInput("image", [1], "BYTES")
    not_an_image.set_data_from_numpy(np.array([b"GIF89a not really"], dtype=object))
    cases = [
        ("no-such-model", [image], None, "404", "model 'no-such-model' is not served"),
        ("tiny-vision", [wrong], None, "400", "must have shape [-1, 3, 32, 32]"),
        ("tiny-vision", [not_an_image], None, "400", "not a readable image"),
        ("tiny-vision", [image], [httpclient.InferRequestedOutput("probs")], "400", "outputs ['probs']"),
    ]
    for model, inputs, outputs, status, message in cases:
        with pytest.raises(InferenceServerException) as caught:
            triton.infer(model, inputs, outputs=outputs)
        assert caught.value.status() == status and message in caught.value.message(), caught.value


def test_plain_json_without_a_content_type(server: RunningServer) -> None:
    """What `curl -d` or a hand-written client sends: JSON without a content type, nested data."""
    body = {
        "id": "plain",
        "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [["the [MASK] sat."]]}],
        "outputs": [{"name": "predictions"}],
    }
    raw = json.dumps(body).encode()
    response = httpx.post(f"{server.url}/v2/models/tiny-mlm/infer", content=raw, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    out = response.json()
    assert out["id"] == "plain" and out["outputs"][0]["datatype"] == "BYTES"
    assert json.loads(out["outputs"][0]["data"][0])[0][0]["token_str"]
    truncated = httpx.post(
        f"{server.url}/v2/models/tiny-mlm/infer",
        content=raw,
        headers={"Inference-Header-Content-Length": str(len(raw) + 1)},
        timeout=30,
    )
    assert truncated.status_code == 400 and "Inference-Header-Content-Length" in truncated.json()["error"]
    announced = {
        "inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 40}}
        ]
    }
    head = json.dumps(announced).encode()
    for tail, message in ((b"\x03\x00\x00\x00abc", "40 bytes announced, fewer sent"), (b"", "fewer sent")):
        response = httpx.post(
            f"{server.url}/v2/models/tiny-mlm/infer",
            content=head + tail,
            headers={"Inference-Header-Content-Length": str(len(head))},
            timeout=30,
        )
        assert response.status_code == 400 and message in response.json()["error"], response.text
    leftover = json.dumps(
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["[MASK]"]}]}
    )
    response = httpx.post(
        f"{server.url}/v2/models/tiny-mlm/infer",
        content=leftover.encode() + b"extra",
        headers={"Inference-Header-Content-Length": str(len(leftover))},
        timeout=30,
    )
    assert (
        response.status_code == 400
        and "5 bytes of binary data belong to no input" in response.json()["error"]
    )


def test_kserve_sdk_rest_and_grpc(
    server: RunningServer, cifar_images: list[bytes], tiny_vision_served: Path, tmp_path: Path
) -> None:
    image = tmp_path / "image.jpg"
    image.write_bytes(cifar_images[8])
    grpc_address = f"127.0.0.1:{server.settings.grpc_port}"
    run = subprocess.run(
        [sys.executable, str(HERE / "kserve_client.py"), server.url, grpc_address, str(image)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["rest_live"] and out["rest_ready"] and out["grpc_live"]
    assert out["rest_id"] == "kserve-rest" and out["grpc_id"] == "kserve-grpc"
    label = labels(tiny_vision_served)[int(np.argmax(out["rest_logits"][0]))]
    assert label == top_label(server, cifar_images[8])
    np.testing.assert_allclose(out["grpc_logits"], out["rest_logits"], rtol=0, atol=1e-5)
    assert len(out["rest_predictions"][0]) == 2
    assert "model 'no-such-model' is not served" in out["rest_error"]


def test_masked_lm_raw_tensors_at_their_own_length(
    server: RunningServer, triton: httpclient.InferenceServerClient, tiny_mlm_served: Path
) -> None:
    """input_ids of the text's own length give the logits of the same text padded to n; positions
    must lie inside the text sent."""
    n = json.loads((tiny_mlm_served / "config.json").read_text())["model"]["n"]
    ids = np.array([[101, 2023, 103, 2154, 102]], dtype=np.int64)  # [CLS] this [MASK] day [SEP]
    positions = np.array([[2]], dtype=np.int64)

    def logits(input_ids: np.ndarray, mask_positions: np.ndarray) -> np.ndarray:
        tensors = [httpclient.InferInput("input_ids", list(input_ids.shape), "INT64")]
        tensors.append(httpclient.InferInput("mask_positions", list(mask_positions.shape), "INT64"))
        tensors[0].set_data_from_numpy(input_ids)
        tensors[1].set_data_from_numpy(mask_positions)
        outputs = [httpclient.InferRequestedOutput("logits")]
        return triton.infer("tiny-mlm", tensors, outputs=outputs).as_numpy("logits")

    own = logits(ids, positions)
    padded = logits(np.pad(ids, ((0, 0), (0, n - ids.shape[1]))), positions)
    assert own.shape == (1, 1, 30522)
    # The server runs static int8 here: padding moves float rounding across a few int8 steps.
    np.testing.assert_allclose(own, padded, rtol=0, atol=0.05)
    with pytest.raises(InferenceServerException) as outside:
        logits(ids, np.array([[5]], dtype=np.int64))  # position 5 of a 5-token text
    assert outside.value.status() == "400" and "mask_positions must be in [0, 5)" in outside.value.message()


def test_boolean_parameters_take_only_json_booleans(server: RunningServer) -> None:
    """`binary_data_output` and `binary_data` are booleans in the schema: 0, 1 or "true" is refused
    with a 400 that names the parameter, where true (what tritonclient sends) is taken."""
    text = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["the [MASK] sat."]}

    def infer(parameters: dict[str, Any] | None, output: dict[str, Any] | None) -> httpx.Response:
        body: dict[str, Any] = {"inputs": [text]}
        if parameters is not None:
            body["parameters"] = parameters
        if output is not None:
            body["outputs"] = [{"name": "predictions", "parameters": output}]
        return httpx.post(f"{server.url}/v2/models/tiny-mlm/infer", json=body, timeout=30)

    refusals: list[tuple[dict[str, Any] | None, dict[str, Any] | None, str]] = [
        ({"binary_data_output": 0}, None, "parameters.binary_data_output"),
        ({"binary_data_output": "true"}, None, "parameters.binary_data_output"),
        (None, {"binary_data": 1}, "outputs.0.parameters.binary_data"),
    ]
    for parameters, output, name in refusals:
        refused = infer(parameters, output)
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]
        assert f"{name}: Input should be a valid boolean" in message, message
    accepted: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = [
        ({"binary_data_output": True}, None),
        (None, {"binary_data": True}),
    ]
    for parameters, output in accepted:
        taken = infer(parameters, output)
        assert taken.status_code == 200 and taken.headers["content-type"] == "application/octet-stream"
