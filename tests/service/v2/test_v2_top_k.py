"""Triton's own clients, over REST and gRPC, ask for the graph's top-k outputs: listed in the
model metadata and configuration with K fixed, answered for the graph's tensors, a masked LM's
texts and a classifier's images, and equal to the top k of the softmax of the same rows' logits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.scores import softmax, top_k_mismatch

pytestmark = pytest.mark.timeout(120)

TOP_K = (TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT)


def _module(transport: str) -> Any:
    return httpclient if transport == "http" else grpcclient


def _check(ids: np.ndarray, scores: np.ndarray, logits: np.ndarray) -> None:
    """The pair is the top k of the softmax of `logits` (computed here, in float64)."""
    rows = logits.reshape(-1, logits.shape[-1])
    probabilities = softmax(rows).reshape(logits.shape)
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    assert top_k_mismatch(ids, scores, probabilities, 1e-6) is None


def test_metadata_and_configuration_list_the_top_k_outputs(
    triton_server: Any, triton_clients: dict[str, Any]
) -> None:
    with triton_server.client() as http:
        models = {m["name"]: m["graph_top_k"] for m in http.get("/models").json()["models"]}
    assert models == {"tiny-mlm": 32, "tiny-vision": 10}
    client = triton_clients["http"]
    mlm = {t["name"]: t for t in client.get_model_metadata("tiny-mlm")["outputs"]}
    assert mlm[TOP_K_IDS_OUTPUT] == {"name": TOP_K_IDS_OUTPUT, "datatype": "INT64", "shape": [-1, -1, 32]}
    assert mlm[TOP_K_SCORES_OUTPUT]["datatype"] == "FP32" and mlm[TOP_K_SCORES_OUTPUT]["shape"] == [
        -1,
        -1,
        32,
    ]
    config = {t["name"]: t for t in client.get_model_config("tiny-vision")["output"]}
    assert config[TOP_K_IDS_OUTPUT]["data_type"] == "TYPE_INT64" and config[TOP_K_IDS_OUTPUT]["dims"] == [10]


def test_token_ids_and_texts_get_the_top_k_outputs(triton_clients: dict[str, Any], transport: str) -> None:
    client, module = triton_clients[transport], _module(transport)
    rng = np.random.default_rng(4)
    ids = module.InferInput("input_ids", [2, 12], "INT64")
    ids.set_data_from_numpy(rng.integers(1000, 5000, (2, 12)).astype(np.int64))
    positions = module.InferInput("mask_positions", [2, 3], "INT64")
    positions.set_data_from_numpy(rng.integers(0, 12, (2, 3)).astype(np.int64))
    # The pair alone (the session runs without copying logits out), then beside the logits.
    pair = client.infer("tiny-mlm", [ids, positions], outputs=[module.InferRequestedOutput(n) for n in TOP_K])
    assert pair.as_numpy("logits") is None and pair.as_numpy(TOP_K_IDS_OUTPUT).shape == (2, 3, 32)
    everything = client.infer("tiny-mlm", [ids, positions])
    logits = everything.as_numpy("logits")
    _check(pair.as_numpy(TOP_K_IDS_OUTPUT), pair.as_numpy(TOP_K_SCORES_OUTPUT), logits)
    np.testing.assert_array_equal(everything.as_numpy(TOP_K_IDS_OUTPUT), pair.as_numpy(TOP_K_IDS_OUTPUT))
    text = module.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"a [MASK] day [MASK] here."]], dtype=object))
    wanted = [module.InferRequestedOutput(n) for n in ("predictions", "logits", *TOP_K)]
    by_text = client.infer("tiny-mlm", [text], outputs=wanted)
    assert by_text.as_numpy(TOP_K_IDS_OUTPUT).shape == (1, 2, 32)
    _check(
        by_text.as_numpy(TOP_K_IDS_OUTPUT), by_text.as_numpy(TOP_K_SCORES_OUTPUT), by_text.as_numpy("logits")
    )


def test_images_get_the_top_k_outputs(
    triton_clients: dict[str, Any], transport: str, cifar_images: list[bytes]
) -> None:
    client, module = triton_clients[transport], _module(transport)
    images = module.InferInput("image", [2, 1], "BYTES")
    images.set_data_from_numpy(np.array([[cifar_images[0]], [cifar_images[1]]], dtype=object))
    wanted = [module.InferRequestedOutput(n) for n in ("logits", *TOP_K)]
    result = client.infer("tiny-vision", [images], outputs=wanted)
    assert result.as_numpy(TOP_K_IDS_OUTPUT).shape == (2, 10)
    _check(result.as_numpy(TOP_K_IDS_OUTPUT), result.as_numpy(TOP_K_SCORES_OUTPUT), result.as_numpy("logits"))
