"""Numbers and counts a client chooses, against a real server (Triton's CVE-2026-24146 pattern): a
v2 request asking for 10^5 outputs (REST and gRPC), and `top_k` of 2^31 and 2^63 on every API,
each get a 4xx error, and health is answered while they are refused. Every wait is bounded."""

from __future__ import annotations

import base64
import threading
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.http.parsing import TINY_PNG_BASE64

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)
PNG = base64.b64decode(TINY_PNG_BASE64)
HUGE = [2**31, 2**63]
TEXT = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a [MASK] day"]}
PIXELS = {"name": "pixel_values", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072}


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server()


def _while_health_answers(server: RunningServer, request: Any) -> httpx.Response:
    """`request(client)`'s answer, made on one thread while another asks for health: both must
    be answered within the clients' timeouts."""
    answers: list[httpx.Response] = []

    def hostile() -> None:
        with server.client(timeout=60) as client:
            answers.append(request(client))

    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    with server.client(timeout=30) as client:
        assert client.get("/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 200
    thread.join(60)
    assert answers, "the hostile request was not answered"
    return answers[0]


def _refused(answer: httpx.Response, *words: str) -> str:
    """The message of a 4xx JSON refusal (either API shape), which names `words`."""
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert all(w in message for w in words), message
    return message


@pytest.mark.parametrize("name", ["logits", "predictions"])
def test_a_hundred_thousand_outputs_are_refused_before_the_model_runs(
    server: RunningServer, name: str
) -> None:
    model, inputs = ("tiny-mlm", [TEXT]) if name == "predictions" else ("tiny-vision", [PIXELS])
    body = {"inputs": inputs, "outputs": [{"name": name}] * 100_000}
    answer = _while_health_answers(server, lambda c: c.post(f"/v2/models/{model}/infer", json=body))
    assert answer.status_code == 400  # not 413 from the size of an answer already computed
    _refused(answer, "requested twice")
    body = {"inputs": inputs, "outputs": [{"name": f"o{i}"} for i in range(100_000)]}
    answer = _while_health_answers(server, lambda c: c.post(f"/v2/models/{model}/infer", json=body))
    assert answer.status_code == 400
    assert _refused(answer, "outputs").endswith("characters)")  # the names listed, cut short


def test_a_hundred_thousand_grpc_outputs_are_refused(start_server: Any) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port())
    request = service_pb2.ModelInferRequest(model_name="tiny-mlm")
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"a [MASK] day"
    )
    for _ in range(100_000):
        request.outputs.add(name="predictions")
    target = f"127.0.0.1:{server.settings.grpc_port}"
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requested twice" in caught.value.details()


@pytest.mark.parametrize("top_k", HUGE)
def test_a_huge_top_k_is_refused_on_every_api(server: RunningServer, top_k: int) -> None:
    requests = [
        lambda c: c.post("/classify", params={"top_k": str(top_k)}, content=PNG),
        lambda c: c.post("/fill-mask", json={"text": "a [MASK] day", "top_k": top_k}),
        lambda c: c.post("/models/tiny-mlm", json={"inputs": "a [MASK] day", "parameters": {"top_k": top_k}}),
        lambda c: c.post(
            "/models/tiny-vision", json={"inputs": TINY_PNG_BASE64, "parameters": {"top_k": top_k}}
        ),
        lambda c: c.post(
            "/v2/models/tiny-mlm/infer", json={"inputs": [TEXT], "parameters": {"top_k": top_k}}
        ),
    ]
    for request in requests:
        _refused(_while_health_answers(server, request), "top_k")
