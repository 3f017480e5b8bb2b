"""Open Inference Protocol v2 over gRPC with tritonclient.grpc, against the server's own process.

The gRPC server runs inside the uvicorn app (same models, same batchers): a request queued by gRPC
is visible in the same queue-depth metric as HTTP traffic, which is how the overload test knows
the queue is full before it sends the request that must be refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from contract.image import ImageTransform
from contract.spec import read_spec

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[3]
LIMIT = 256 * 1024


def _start(start_server: Any, **overrides: Any) -> RunningServer:
    from support.servers import free_port

    return start_server(grpc_port=free_port(), **overrides)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return _start(start_server, max_upload_bytes=LIMIT)


@pytest.fixture(scope="module")
def triton(server: RunningServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")


def status_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_health_and_metadata(triton: grpcclient.InferenceServerClient) -> None:
    assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("tiny-mlm")
    meta = triton.get_server_metadata(as_json=True)
    assert meta["name"] == "gmlp-serve" and meta["extensions"] == [
        "binary_tensor_data",
        "model_configuration",
        "statistics",
        "model_repository",
    ]
    model = triton.get_model_metadata("tiny-vision", as_json=True)
    assert model["platform"] == "onnxruntime_onnx" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"]) for t in model["inputs"]] == [("pixel_values", "FP32")]
    encoded = triton.get_model_metadata("tiny-vision-ensemble", as_json=True)
    assert encoded["name"] == "tiny-vision-ensemble" and encoded["versions"] == ["1"]
    assert [(t["name"], t["datatype"]) for t in encoded["inputs"]] == [("image", "BYTES")]
    assert encoded["outputs"] == model["outputs"] and triton.is_model_ready("tiny-vision-ensemble")
    error = status_of(lambda: triton.get_model_metadata("nope"))
    assert error.status() == "StatusCode.NOT_FOUND" and "model 'nope' is not served" in error.message()


def test_infer_raw_image_and_text(
    server: RunningServer,
    triton: grpcclient.InferenceServerClient,
    cifar_images: list[bytes],
    tiny_vision_served: Path,
) -> None:
    spec = read_spec(tiny_vision_served)
    assert spec is not None
    batch = np.stack(
        [
            ImageTransform.from_config(spec.config["preprocessing"], 10**8, (32, 32))(i)
            for i in cifar_images[:2]
        ]
    )
    raw = grpcclient.InferInput("pixel_values", list(batch.shape), "FP32")
    raw.set_data_from_numpy(batch)
    raw_result = triton.infer("tiny-vision", [raw], request_id="g-raw")
    assert raw_result.get_response().id == "g-raw"
    image = grpcclient.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(np.array(cifar_images[:2], dtype=object))
    image_logits = triton.infer("tiny-vision", [image], outputs=[grpcclient.InferRequestedOutput("logits")])
    np.testing.assert_allclose(
        image_logits.as_numpy("logits"), raw_result.as_numpy("logits"), rtol=0, atol=1e-5
    )
    labels = json.loads((tiny_vision_served / "labels.json").read_text())
    with server.client() as client:
        expected = [
            client.post("/classify", params={"top_k": 1}, content=im).json()["predictions"][0]["label"]
            for im in cifar_images[:2]
        ]
    assert [labels[i] for i in raw_result.as_numpy("logits").argmax(axis=1)] == expected
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"the [MASK] sat on the mat."], dtype=object))
    predictions = triton.infer("tiny-mlm", [text], parameters={"top_k": 4}).as_numpy("predictions")
    with server.client() as client:
        fill = client.post("/fill-mask", json={"text": "the [MASK] sat on the mat.", "top_k": 4}).json()
    assert json.loads(predictions[0]) == fill["predictions"]


def test_typed_tensor_contents(server: RunningServer, triton: grpcclient.InferenceServerClient) -> None:
    """Clients that fill `contents` instead of raw bytes (the protocol allows both)."""
    request = service_pb2.ModelInferRequest(model_name="tiny-vision", id="typed")
    tensor = request.inputs.add(name="pixel_values", datatype="FP32", shape=[1, 3, 32, 32])
    tensor.contents.fp32_contents.extend([0.25] * (3 * 32 * 32))
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    typed = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    raw = grpcclient.InferInput("pixel_values", [1, 3, 32, 32], "FP32")
    raw.set_data_from_numpy(np.full((1, 3, 32, 32), 0.25, np.float32))
    expected = triton.infer("tiny-vision", [raw]).as_numpy("logits")[0]
    assert response.id == "typed" and list(response.outputs[0].shape) == [1, 10]
    np.testing.assert_allclose(typed, expected, rtol=0, atol=1e-5)
    half = service_pb2.ModelInferRequest(model_name="tiny-vision")
    half.inputs.add(name="pixel_values", datatype="FP16", shape=[1])
    two_raws = service_pb2.ModelInferRequest(model_name="tiny-vision", raw_input_contents=[b"", b""])
    two_raws.inputs.add(name="pixel_values", datatype="FP32", shape=[0])
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for bad, message in ((half, "must be sent in raw_input_contents"), (two_raws, "send one per input")):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(bad, timeout=30)
            assert (
                caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()
            )


def test_errors_and_message_size(triton: grpcclient.InferenceServerClient) -> None:
    wrong = grpcclient.InferInput("pixel_values", [1, 3, 8, 8], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    error = status_of(lambda: triton.infer("tiny-vision", [wrong]))
    assert (
        error.status() == "StatusCode.INVALID_ARGUMENT"
        and "must have shape [-1, 3, 32, 32]" in error.message()
    )
    no_mask = grpcclient.InferInput("text", [1], "BYTES")
    no_mask.set_data_from_numpy(np.array([b"nothing to fill"], dtype=object))
    error = status_of(lambda: triton.infer("tiny-mlm", [no_mask]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "contains no [MASK]" in error.message()
    big = grpcclient.InferInput("image", [1], "BYTES")
    big.set_data_from_numpy(np.array([b"\xff" * (LIMIT + 1)], dtype=object))
    assert status_of(lambda: triton.infer("tiny-vision", [big])).status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_calls_are_counted_by_method_and_status(
    server: RunningServer, triton: grpcclient.InferenceServerClient
) -> None:
    def count(method: str, code: str) -> float:
        return server.metric("gmlp_grpc_calls_total", method=method, code=code)

    before = count("ModelInfer", "OK"), count("ModelInfer", "INVALID_ARGUMENT"), count("ServerLive", "OK")
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"the cat sat on the [MASK]."], dtype=object))
    triton.infer("tiny-mlm", [text])
    wrong = grpcclient.InferInput("pixel_values", [1, 3, 8, 8], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    status_of(lambda: triton.infer("tiny-vision", [wrong]))
    assert triton.is_server_live()
    after = count("ModelInfer", "OK"), count("ModelInfer", "INVALID_ARGUMENT"), count("ServerLive", "OK")
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
    latency = server.metric("gmlp_grpc_call_duration_seconds_count", method="ModelInfer", code="OK")
    assert latency >= 1


def test_deadline_and_overload(start_server: Any) -> None:
    """A request held in the queue: the next one is refused (UNAVAILABLE), the held one runs out of
    its gRPC deadline (DEADLINE_EXCEEDED) before the long batching window ends."""
    held_server = _start(
        start_server, max_queue_size=1, max_queue_delay_ms=60_000.0, queue_delay_policy="always"
    )
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{held_server.settings.grpc_port}")
    tensor = grpcclient.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"a [MASK] day"], dtype=object))
    outcome: dict[str, InferenceServerException] = {}

    def held() -> None:
        try:
            client.infer("tiny-mlm", [tensor], client_timeout=5.0)
        except InferenceServerException as exc:
            outcome["held"] = exc

    thread = threading.Thread(target=held)
    thread.start()
    held_server.wait_for(lambda: held_server.metric("gmlp_queue_depth", model="tiny-mlm", version="1") == 1)
    refused = status_of(lambda: client.infer("tiny-mlm", [tensor], client_timeout=30.0))
    thread.join(30)
    assert (
        refused.status() == "StatusCode.UNAVAILABLE"
        and "queue of model tiny-mlm is full" in refused.message()
    )
    assert outcome["held"].status() == "StatusCode.DEADLINE_EXCEEDED"
    held_server.wait_for(lambda: held_server.metric("gmlp_queue_depth", model="tiny-mlm", version="1") == 0)


def test_committed_stubs_match_the_proto() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "grpc_stubs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
