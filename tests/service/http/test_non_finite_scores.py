"""A model whose outputs are NaN or infinite never makes a 500 on any API: served by a real
server, a classifier and a masked LM whose graphs (built here with the `onnx` helper API) put NaN,
+inf and -inf among their logits answer `/classify`, `/fill-mask` and the Hugging Face API with
200 and valid JSON whose non-finite scores are `null`, as v2 REST writes non-finite tensor
elements; gRPC carries the exact IEEE values."""

from __future__ import annotations

import base64
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from support.broken_dirs import read_config
from support.servers import RunningServer, free_port

pytestmark = pytest.mark.timeout(240)

# The first logits of every row; the rest are finite (0).
NON_FINITE = [math.nan, math.inf, -math.inf]
OPSET = 17


def _model(inputs: list[Any], nodes: list[Any], initializers: list[Any], rows: list[Any], k: int) -> Any:
    """A graph whose `logits` end in a constant row holding NaN, +inf and -inf, with the top-k
    outputs an export adds (softmax probabilities and their ids, best first)."""
    nodes = [
        *nodes,
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        helper.make_node("TopK", ["probabilities", "k"], [TOP_K_SCORES_OUTPUT, TOP_K_IDS_OUTPUT], axis=-1),
    ]
    initializers = [*initializers, numpy_helper.from_array(np.array([k], dtype=np.int64), "k")]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, rows),
        helper.make_tensor_value_info(TOP_K_IDS_OUTPUT, TensorProto.INT64, [*rows[:-1], k]),
        helper.make_tensor_value_info(TOP_K_SCORES_OUTPUT, TensorProto.FLOAT, [*rows[:-1], k]),
    ]
    graph = helper.make_graph(nodes, "non-finite", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _bias(width: int) -> np.ndarray:
    bias = np.zeros(width, dtype=np.float32)
    bias[: len(NON_FINITE)] = NON_FINITE
    return bias


def _classifier(classes: int, k: int) -> Any:
    """logits [batch, classes] = flatten(pixels) @ 0 + bias."""
    pixels = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])
    nodes = [
        helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "weight"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["logits"]),
    ]
    weight = numpy_helper.from_array(np.zeros((3 * 32 * 32, classes), dtype=np.float32), "weight")
    bias = numpy_helper.from_array(_bias(classes), "bias")
    return _model([pixels], nodes, [weight, bias], ["batch", classes], k)


def _masked_lm(vocab: int, k: int) -> Any:
    """logits [batch, predictions, vocab] = mask_positions * 0 + bias (input_ids unused)."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("mask_positions", TensorProto.INT64, ["batch", "predictions"]),
    ]
    nodes = [
        helper.make_node("Cast", ["mask_positions"], ["positions"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["positions", "last"], ["column"]),
        helper.make_node("Mul", ["column", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "bias"], ["logits"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array([2], dtype=np.int64), "last"),
        numpy_helper.from_array(np.zeros(1, dtype=np.float32), "zero"),
        numpy_helper.from_array(_bias(vocab), "bias"),
    ]
    return _model(inputs, nodes, initializers, ["batch", "predictions", vocab], k)


def _served(source: Path, target: Path, model: Any) -> Path:
    """`source`'s served directory (labels or tokenizer, config) with `model` as its only variant
    and without the recorded check (whose outputs were the real model's)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.onnx", "check.npz"))
    onnx.save(model, target / "model.onnx")
    config = read_config(target)
    config.pop("check")
    config["variants"], config["name"] = {"fp32": "model.onnx"}, target.name
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    start_server: Any,
    tiny_vision_served: Path,
    tiny_mlm_served: Path,
) -> RunningServer:
    repo = tmp_path_factory.mktemp("non-finite")
    vision, mlm = read_config(tiny_vision_served), read_config(tiny_mlm_served)
    classes, vocab = vision["model"]["num_classes"], mlm["vocab_size"]
    _served(tiny_vision_served, repo / "nan-vision", _classifier(classes, vision["graph_top_k"]))
    _served(tiny_mlm_served, repo / "nan-mlm", _masked_lm(vocab, mlm["graph_top_k"]))
    return start_server(model_repository=repo, grpc_port=free_port())


def _scores(answer: Any) -> list[Any]:
    """Every `score` of an answer (nested lists of entries)."""
    if isinstance(answer, list):
        return [s for item in answer for s in _scores(item)]
    return [answer["score"]] if isinstance(answer, dict) and "score" in answer else []


def _strict(response: Any) -> Any:
    """The body, which must be JSON as RFC 8259 writes it (no NaN or Infinity tokens)."""
    assert response.status_code == 200, response.text

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in the JSON answer")

    return json.loads(response.text, parse_constant=refuse)


def test_task_routes_answer_null_scores(server: RunningServer, cifar_images: list[bytes]) -> None:
    with server.client() as client:
        classified = _strict(client.post("/classify?model=nan-vision&top_k=3", content=cifar_images[0]))
        filled = _strict(client.post("/fill-mask", json={"text": "the [MASK] is here.", "model": "nan-mlm"}))
        # More than the graph's K: ranked from the logits rows, not the top-k outputs.
        many = {"text": "the [MASK] is here.", "model": "nan-mlm", "top_k": 40}
        from_logits = _strict(client.post("/fill-mask", json=many))
    # Softmax over a row holding NaN is NaN everywhere: no score is a number, every one is null,
    # and each answer still has its top_k entries.
    assert _scores(classified["predictions"]) == [None] * 3
    assert _scores(filled["predictions"]) == [None] * 5
    assert _scores(from_logits["predictions"]) == [None] * 40
    # The quality histograms leave such predictions out rather than turn their sums into NaN.
    for name in ("gmlp_prediction_confidence_sum", "gmlp_prediction_margin_sum"):
        assert math.isfinite(server.metric(name, model="nan-mlm", version="1"))


def test_hugging_face_api_answers_null_scores(server: RunningServer, cifar_images: list[bytes]) -> None:
    with server.client() as client:
        # The raw logits (no softmax): NaN, +inf, -inf are null, the finite ones stay numbers.
        raw = client.post(
            "/models/nan-vision",
            json={
                "inputs": base64.b64encode(cifar_images[0]).decode(),
                "parameters": {"function_to_apply": "none", "top_k": 10},
            },
        )
        filled = client.post("/models/nan-mlm", json={"inputs": "a [MASK] and a [MASK]."})
    scores = {entry["label"]: entry["score"] for entry in _strict(raw)}
    labels = json.loads((server.settings.model_repository / "nan-vision" / "labels.json").read_text())
    assert [scores[label] for label in labels[:3]] == [None, None, None]
    assert all(scores[label] == 0.0 for label in labels[3:])
    assert _scores(_strict(filled)) == [None] * 10


def test_v2_answers_null_over_rest_and_exact_values_over_grpc(server: RunningServer) -> None:
    body = {
        "inputs": [
            {"name": "pixel_values", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}
        ],
        "outputs": [{"name": "logits"}],
    }
    with server.client() as client:
        answer = _strict(client.post("/v2/models/nan-vision/infer", json=body))
    assert answer["outputs"][0]["data"][:4] == [None, None, None, 0.0]

    grpc = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")
    pixels = grpcclient.InferInput("pixel_values", [1, 3, 32, 32], "FP32")
    pixels.set_data_from_numpy(np.zeros((1, 3, 32, 32), dtype=np.float32))
    logits = grpc.infer("nan-vision", [pixels]).as_numpy("logits")[0]
    assert np.isnan(logits[0]) and logits[1] == np.inf and logits[2] == -np.inf
