"""Requests that stock tools build from the model configuration alone are answered.

perf_analyzer and similar tools read the configuration, fill every input it requires with data of
the listed shapes and datatypes, and ask for every listed output. For both kinds of model, over
REST and gRPC, such a request (random data; -1 dimensions given a size) must succeed; a request
that mixes the graph's tensors with the encoded form still gets the clear refusal; and each form
produces every output (a masked LM's token ids decode into the predictions its text would get).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from contract.spec import read_spec
from contract.text import FillMaskCodec

pytestmark = pytest.mark.timeout(120)

NUMPY = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64}
FREE_SIZE = 4  # the size a -1 dimension is given; integer inputs are drawn from [0, FREE_SIZE)


def _module(transport: str) -> Any:
    return httpclient if transport == "http" else grpcclient


def _config(client: Any, transport: str, name: str) -> dict[str, Any]:
    """The configuration as tritonclient.http returns it (gRPC: converted with the protobuf JSON)."""
    if transport == "http":
        return client.get_model_config(name)
    from google.protobuf import json_format

    config = client.get_model_config(name).config
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def request_from_config(transport: str, config: dict[str, Any], seed: int) -> tuple[list[Any], list[Any]]:
    """Every required input with random data of its dims (batch 1), every output requested."""
    module, rng = _module(transport), np.random.default_rng(seed)
    inputs = []
    for tensor in config["input"]:
        if tensor.get("optional", False):
            continue
        shape = [1, *(FREE_SIZE if int(d) < 0 else int(d) for d in tensor["dims"])]
        dtype = NUMPY[tensor["data_type"]]
        data = (
            rng.standard_normal(shape).astype(dtype)
            if np.issubdtype(dtype, np.floating)
            else rng.integers(0, FREE_SIZE, shape).astype(dtype)
        )
        datatype = tensor["data_type"].removeprefix("TYPE_")
        infer_input = module.InferInput(tensor["name"], shape, datatype)
        infer_input.set_data_from_numpy(data)
        inputs.append(infer_input)
    outputs = [module.InferRequestedOutput(t["name"]) for t in config["output"]]
    return inputs, outputs


@pytest.mark.parametrize("name", ["tiny-vision", "tiny-mlm"])
def test_a_request_built_from_the_config_is_answered(
    triton_clients: dict[str, Any], transport: str, name: str
) -> None:
    client = triton_clients[transport]
    config = _config(client, transport, name)
    for seed in range(3):
        inputs, outputs = request_from_config(transport, config, seed)
        assert inputs and outputs
        result = client.infer(name, inputs, outputs=outputs)
        for tensor in config["output"]:
            array = result.as_numpy(tensor["name"])
            assert array is not None and array.shape[0] == 1, tensor["name"]
            assert len(array.shape) == 1 + len(tensor["dims"])
            if tensor["data_type"] == "TYPE_STRING":
                ranked = json.loads(array.ravel()[0])
                assert len(ranked) >= 1 and all(len(slot) >= 1 for slot in ranked)
            else:
                assert np.isfinite(array).all()


def _bytes(transport: str, name: str, items: list[bytes]) -> Any:
    tensor = _module(transport).InferInput(name, [len(items), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[i] for i in items], dtype=object))
    return tensor


def test_mixed_forms_are_refused(triton_clients: dict[str, Any], transport: str) -> None:
    client = triton_clients[transport]
    config = _config(client, transport, "tiny-vision")
    inputs, _ = request_from_config(transport, config, 0)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("tiny-vision", [*inputs, _bytes(transport, "image", [b"x"])])
    message = caught.value.message()
    assert "takes the inputs ['pixel_values'] or ['image']" in message
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_texts_and_token_ids_produce_the_same_outputs(
    triton_clients: dict[str, Any], transport: str, tiny_mlm_served: Path
) -> None:
    client, module = triton_clients[transport], _module(transport)
    texts = [b"the [MASK] sat on the mat.", b"a [MASK] day [MASK] here."]
    outputs = [module.InferRequestedOutput("logits"), module.InferRequestedOutput("predictions")]
    spec = read_spec(tiny_mlm_served)
    assert spec is not None
    codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config)
    for text in texts:
        by_text = client.infer("tiny-mlm", [_bytes(transport, "text", [text])], outputs=outputs)
        encoded = codec.encode(text.decode())
        ids = module.InferInput("input_ids", [1, len(encoded.ids)], "INT64")
        ids.set_data_from_numpy(np.array([encoded.ids], np.int64))
        positions = module.InferInput("mask_positions", [1, len(encoded.mask_positions)], "INT64")
        positions.set_data_from_numpy(np.array([encoded.mask_positions], np.int64))
        by_ids = client.infer("tiny-mlm", [ids, positions], outputs=outputs)
        np.testing.assert_allclose(by_text.as_numpy("logits"), by_ids.as_numpy("logits"), rtol=0, atol=1e-5)
        assert by_text.as_numpy("logits").shape[:2] == (1, len(encoded.mask_positions))
        text_predictions = json.loads(by_text.as_numpy("predictions").ravel()[0])
        id_predictions = json.loads(by_ids.as_numpy("predictions").ravel()[0])
        assert [[p["token"] for p in slot] for slot in text_predictions] == [
            [p["token"] for p in slot] for slot in id_predictions
        ]
        assert [slot[0]["sequence"] for slot in text_predictions] == [
            slot[0]["sequence"] for slot in id_predictions
        ]
    # Texts with different numbers of [MASK]s have logits of different shapes: not one tensor.
    with pytest.raises(InferenceServerException) as caught:
        client.infer("tiny-mlm", [_bytes(transport, "text", texts)], outputs=outputs)
    assert "same number of [MASK] tokens" in caught.value.message()
    predictions = client.infer("tiny-mlm", [_bytes(transport, "text", texts)]).as_numpy("predictions")
    assert predictions.shape == (2, 1)


@pytest.mark.parametrize(("name", "encoded"), [("tiny-vision", "image"), ("tiny-mlm", "text")])
def test_each_form_has_its_own_name_and_every_call_agrees(
    triton_clients: dict[str, Any], transport: str, name: str, encoded: str, cifar_images: list[bytes]
) -> None:
    """NAME lists the graph's tensors, NAME-ensemble the encoded input: metadata, configuration,
    readiness, inference and statistics answer under both names alike."""
    client, alias = triton_clients[transport], f"{name}-ensemble"
    configs = {n: _config(client, transport, n) for n in (name, alias)}
    metadata = {
        n: client.get_model_metadata(n, as_json=True) if transport == "grpc" else client.get_model_metadata(n)
        for n in (name, alias)
    }
    graph = sorted(t["name"] for t in configs[name]["input"])
    assert graph == (["pixel_values"] if name == "tiny-vision" else ["input_ids", "mask_positions"])
    assert [t["name"] for t in configs[alias]["input"]] == [encoded]
    for n in (name, alias):
        assert configs[n]["name"] == metadata[n]["name"] == n and client.is_model_ready(n)
        assert [t["name"] for t in configs[n]["input"]] == [t["name"] for t in metadata[n]["inputs"]]
        assert not any(t.get("optional", False) for t in configs[n]["input"])
        assert [t["name"] for t in configs[n]["output"]] == [t["name"] for t in metadata[n]["outputs"]]
    assert configs[alias]["output"] == configs[name]["output"]
    item = cifar_images[0] if name == "tiny-vision" else b"the [MASK] sat."
    count = _count(client, transport, alias)
    result = client.infer(alias, [_bytes(transport, encoded, [item])])
    response = result.get_response(as_json=True) if transport == "grpc" else result.get_response()
    assert response["model_name"] == alias
    assert _count(client, transport, alias) == count + 1 == _count(client, transport, name)
    # The model's own name still takes the encoded form, as it always did.
    assert (
        client.infer(name, [_bytes(transport, encoded, [item])]).as_numpy(
            "logits" if name == "tiny-vision" else "predictions"
        )
        is not None
    )


def _count(client: Any, transport: str, name: str) -> int:
    stats = (
        client.get_inference_statistics(name, as_json=True)
        if transport == "grpc"
        else client.get_inference_statistics(name)
    )
    (entry,) = stats["model_stats"]
    assert entry["name"] == name
    return int(entry["inference_count"])
