"""The tiny models served with backend openvino answer as ONNX Runtime serves them (v2 REST, /classify,
/fill-mask), and say what runs them and at what precision (/models, the v2 model config)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from service.engine.backends import BF16_FLAGS, cpu_flags

if TYPE_CHECKING:
    from support.servers import RunningServer

pytest.importorskip("openvino")
pytestmark = pytest.mark.timeout(180)

# OpenVINO computes in bf16 on CPUs with bf16 instructions (a looser bound then), else in fp32.
PRECISION = "bf16" if BF16_FLAGS & cpu_flags() else "fp32"
ATOL = 5e-2 if PRECISION == "bf16" else 1e-4


@pytest.fixture(scope="module")
def servers(start_server: Any) -> dict[str, RunningServer]:
    """The same repository on each backend, both running the fp32 graphs."""
    return {
        "openvino": start_server(backend="openvino", instances=2),
        "onnxruntime": start_server(variant="fp32"),
    }


def triton(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")


def infer(server: RunningServer, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = []
    for name, array in feeds.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT64"
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = triton(server).infer(model, inputs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_openvino_reports_itself_and_its_precision(servers: dict[str, RunningServer]) -> None:
    with servers["openvino"].client() as client:
        models = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert len(models) == 2
    for model in models.values():
        assert (model["provider"], model["precision"]) == ("OpenVINO CPU", PRECISION)
        assert model["variant"] == "fp32"  # int8 exported too, not chosen
    with servers["onnxruntime"].client() as client:
        reference = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert {m["precision"] for m in reference.values()} == {"fp32"}
    assert {m["provider"] for m in reference.values()} == {"CPUExecutionProvider"}
    parameters = triton(servers["openvino"]).get_model_config("tiny-vision")["parameters"]
    assert parameters["precision"] == {"string_value": PRECISION}
    assert parameters["execution_provider"] == {"string_value": "OpenVINO CPU"}


def test_openvino_answers_v2_requests_as_onnx_runtime(servers: dict[str, RunningServer]) -> None:
    rng = np.random.default_rng(3)
    vision = {"pixel_values": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)}
    ids = rng.integers(1000, 2000, size=(3, 9))
    mlm = {"input_ids": ids, "mask_positions": np.array([[1, 4], [0, 8], [2, 3]])}
    for model, feeds in (("tiny-vision", vision), ("tiny-mlm", mlm)):
        got, want = (infer(servers[backend], model, feeds) for backend in ("openvino", "onnxruntime"))
        assert got.keys() == want.keys() and "logits" in got
        np.testing.assert_allclose(got["logits"], want["logits"], atol=ATOL)
        np.testing.assert_allclose(got["topk_scores"], want["topk_scores"], atol=ATOL)


def test_openvino_answers_the_task_routes_as_onnx_runtime(
    servers: dict[str, RunningServer], cifar_images: list[bytes]
) -> None:
    got, want = (answers(servers[backend], cifar_images[:6]) for backend in ("openvino", "onnxruntime"))
    assert len(got) == len(want) == 6 + 2
    for (names, scores), (want_names, want_scores) in zip(got, want, strict=True):
        assert names == want_names or PRECISION == "bf16"  # a near tie may swap in bf16
        np.testing.assert_allclose(scores, want_scores, atol=ATOL)


def answers(server: RunningServer, images: list[bytes]) -> list[tuple[list[str], list[float]]]:
    """The names and scores of the top 3 of each /classify answer, and of each mask of a /fill-mask."""
    with server.client() as client:
        ranked = [client.post("/classify", params={"top_k": 3}, content=image) for image in images]
        filled = client.post("/fill-mask", json={"text": "the [MASK] sat on the [MASK].", "top_k": 3})
    assert all(r.status_code == 200 for r in [*ranked, filled]), [r.text for r in [*ranked, filled]]
    lists = [r.json()["predictions"] for r in ranked] + filled.json()["predictions"]
    return [([p.get("label") or p["token_str"] for p in top], [p["score"] for p in top]) for top in lists]
