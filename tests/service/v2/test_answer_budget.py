"""The size of a v2 answer is bounded before it is built, and a big answer is encoded off the loop.

Real servers (uvicorn and gRPC on 127.0.0.1, the tiny exported models: a masked LM with BERT's
vocabulary of 30522 tokens and up to 16 [MASK]s per text). The hostile request is the one of a
couple of kilobytes that asks for the logits of 16 texts of 16 [MASK]s each: 7.8 million numbers.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from contract.tensors import Tensor
from service.v2.inference import answer_size

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

INFER = "/v2/models/tiny-mlm/infer"
MASKS = 16  # the tiny model's max_predictions


def logits_request(texts: int, masks: int = MASKS, **parameters: Any) -> dict[str, Any]:
    """`texts` texts of `masks` [MASK]s each, asking for the graph's logits."""
    data = [" ".join(["[MASK]"] * masks)] * texts
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [texts, 1], "data": data}],
        "outputs": [{"name": "logits"}],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def binary_logits(response: Any) -> np.ndarray:
    """The logits of a binary answer (JSON head, then the raw FP32 bytes)."""
    head_length = int(response.headers["inference-header-content-length"])
    head = json.loads(response.content[:head_length])
    (output,) = head["outputs"]
    raw = response.content[head_length:]
    assert output["parameters"]["binary_data_size"] == len(raw)
    return np.frombuffer(raw, dtype="<f4").reshape(output["shape"])


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(max_batch_size=16)  # the default limits (and batch size)


def test_a_small_request_cannot_produce_more_json_than_the_limit(server: RunningServer) -> None:
    request = logits_request(16)
    assert len(json.dumps(request)) < 2500
    limit = server.settings.max_response_bytes
    with server.client() as client:
        refused = client.post(INFER, json=request)
        one = client.post(INFER, json=logits_request(1))
        binary = client.post(INFER, json=logits_request(16, binary_data_output=True))
    assert refused.status_code == 413, refused.text
    message = refused.json()["error"]
    assert "max_response_bytes" in message and "binary_data" in message and str(limit) in message
    # Independently: one text's JSON answer is allowed, and sixteen of them would be over the limit.
    assert one.status_code == 200 and len(one.content) <= limit
    assert 16 * len(one.content) > limit
    # The same tensors as binary data fit (4 bytes per number), and are exactly that.
    assert binary.status_code == 200, binary.text
    logits = binary_logits(binary)
    assert logits.shape == (16, MASKS, 30522)
    assert logits.nbytes <= server.settings.max_binary_response_bytes
    assert server.metric("gmlp_refusals_total", transport="v2", code="response_too_large") >= 1


def test_the_bound_holds_the_json_the_server_writes(server: RunningServer) -> None:
    """The answer the server writes (slice by slice) is the standard JSON of its document, and no
    longer than the bound the limit is checked against."""
    with server.client() as client:
        response = client.post(INFER, json=logits_request(2, masks=3))
    assert response.status_code == 200, response.text
    document = response.json()
    assert response.content == json.dumps(document, separators=(",", ":")).encode()
    (output,) = document["outputs"]
    tensor = Tensor("logits", "FP32", np.asarray(output["data"], np.float32).reshape(output["shape"]))
    envelope = len(document["model_name"]) + len(document["model_version"]) + len(document.get("id", ""))
    assert len(response.content) <= answer_size([tensor], lambda name: False, envelope).json


def test_raw_answers_have_their_own_limit_on_rest_and_grpc(start_server: Any) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port(), max_batch_size=16, max_binary_response_bytes=1024 * 1024)
    with server.client() as client:
        refused = client.post(INFER, json=logits_request(16, binary_data_output=True))
        small = client.post(INFER, json=logits_request(1, masks=2, binary_data_output=True))
    assert refused.status_code == 413 and "max_binary_response_bytes" in refused.json()["error"]
    assert small.status_code == 200 and binary_logits(small).shape == (1, 2, 30522)

    triton = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")
    try:
        texts = grpcclient.InferInput("text", [16, 1], "BYTES")
        texts.set_data_from_numpy(np.array([[" ".join(["[MASK]"] * MASKS)]] * 16, dtype=object))
        wanted = [grpcclient.InferRequestedOutput("logits")]
        with pytest.raises(InferenceServerException) as caught:
            triton.infer("tiny-mlm", [texts], outputs=wanted)
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "max_binary_response_bytes" in caught.value.message()
        one = grpcclient.InferInput("text", [1, 1], "BYTES")
        one.set_data_from_numpy(np.array([["[MASK] [MASK]"]], dtype=object))
        assert triton.infer("tiny-mlm", [one], outputs=wanted).as_numpy("logits").shape == (1, 2, 30522)
    finally:
        triton.close()


def test_health_answers_while_a_big_answer_is_encoded(start_server: Any) -> None:
    """Once the model has run (the request is counted), only the answer's encoding is left: a
    liveness probe sent then is answered before the big answer's headers arrive."""
    server = start_server(max_response_bytes=256 * 1024 * 1024)
    state = server.app.state.service
    version = state.loaded("tiny-mlm").version

    def successes() -> int:
        (counted,) = state.metrics.statistics.counters([("tiny-mlm", version)])
        return counted.success.count

    before = successes()
    headers_at: list[float] = []

    def big() -> int:
        with (
            server.client(timeout=120) as client,
            client.stream("POST", INFER, json=logits_request(4)) as answer,
        ):
            headers_at.append(time.monotonic())
            assert answer.status_code == 200
            return sum(len(chunk) for chunk in answer.iter_bytes())

    with ThreadPoolExecutor(1) as pool, server.client() as probe:
        probe.get("/v2/health/live")  # connected before
        pending = pool.submit(big)
        server.wait_for(lambda: successes() > before, timeout=60)
        sent = time.monotonic()
        live = probe.get("/v2/health/live")
        answered = time.monotonic()
        size = pending.result(timeout=120)
    assert live.status_code == 200
    assert size > 4 * MASKS * 30522 * 10  # a big answer indeed (about 20 bytes a number)
    assert answered < headers_at[0], "the probe waited for the big answer's encoding"
    assert answered - sent < 1.0
