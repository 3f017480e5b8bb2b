"""The v2 model-repository extension with the stock clients (tritonclient HTTP and gRPC), unchanged:
index, load (with a version policy in `config`), unload, readiness per version, inference on the
default and on a pinned version, and the answers for unknown models and versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from support.repository_servers import (
    is_grpc,
    start_repository_server,
    triton_grpc,
    triton_http,
    version_states,
    versioned_repository,
)
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

BOTH = {"specific": {"versions": [1, 2]}}


def _policy(client: Any, name: str) -> dict[str, Any]:
    """The version policy in the model configuration, through a stock client (versions as ints:
    gRPC's JSON writes int64 as strings)."""
    config = client.get_model_config(name, **({"as_json": True} if is_grpc(client) else {}))
    policy = (config["config"] if is_grpc(client) else config)["version_policy"]
    if "specific" in policy:
        policy = {"specific": {"versions": [int(v) for v in policy["specific"]["versions"]]}}
    return dict(policy)


@pytest.fixture(scope="module")
def repo(
    tmp_path_factory: pytest.TempPathFactory, tiny_vision_served: Path, tiny_vision_v2_served: Path
) -> Path:
    import shutil

    root = versioned_repository(
        tmp_path_factory.mktemp("versioned"),
        {"tiny-vision": {1: tiny_vision_served, 2: tiny_vision_v2_served}},
    )
    shutil.copytree(tiny_vision_served.parent / "tiny-mlm", root / "tiny-mlm")  # the flat layout: version 1
    return root


@pytest.fixture(scope="module")
def server(start_server: Any, repo: Path) -> RunningServer:
    return start_repository_server(
        start_server, model_repository=repo, model_control="explicit", load_model="tiny-mlm"
    )


def states(client: Any, name: str = "tiny-vision") -> dict[str, str]:
    return version_states(client, name)


def infer(client: Any, image: bytes, version: str = "") -> tuple[str, np.ndarray]:
    module = grpcclient if is_grpc(client) else httpclient
    tensor = module.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=np.object_))
    result = client.infer("tiny-vision", [tensor], model_version=version)
    response = result.get_response(**({"as_json": True} if is_grpc(client) else {}))
    return response["model_version"], result.as_numpy("logits")


def statistics(client: Any, version: str = "") -> tuple[str, int]:
    """The version a statistics answer names for tiny-vision and its inference count."""
    stats = client.get_inference_statistics(
        "tiny-vision", version, **({"as_json": True} if is_grpc(client) else {})
    )
    (entry,) = stats["model_stats"]
    return entry["version"], int(entry.get("inference_count", 0))  # gRPC's JSON leaves zeros out


def refusal(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_load_pin_unload(server: RunningServer, cifar_images: list[bytes], transport: str) -> None:
    client = triton_http(server) if transport == "http" else triton_grpc(server)
    not_found = "404" if transport == "http" else "StatusCode.NOT_FOUND"
    unavailable = "503" if transport == "http" else "StatusCode.UNAVAILABLE"
    image = cifar_images[0]
    # Known but not loaded: listed, not ready, and requests answer "not loaded" (404).
    assert states(client) == {"1": "UNAVAILABLE", "2": "UNAVAILABLE"}
    assert states(client, "tiny-mlm") == {"1": "READY"}
    assert not client.is_model_ready("tiny-vision")
    error = refusal(lambda: infer(client, image))
    assert error.status() == not_found and "not loaded" in error.message()

    # latest:1 (the default policy): version 2 only.
    client.load_model("tiny-vision")
    assert states(client) == {"1": "UNAVAILABLE", "2": "READY"}
    assert client.is_model_ready("tiny-vision") and client.is_model_ready("tiny-vision", "2")
    assert not client.is_model_ready("tiny-vision", "1")
    version, newest = infer(client, image)
    assert version == "2" and np.array_equal(infer(client, image, "2")[1], newest)
    assert refusal(lambda: infer(client, image, "1")).status() == unavailable
    missing = refusal(lambda: infer(client, image, "9"))
    assert missing.status() == not_found and "has no version '9'" in missing.message()

    # Both versions side by side (the config's version_policy, as Triton's clients send it).
    client.load_model("tiny-vision", config=json.dumps({"version_policy": BOTH}))
    assert states(client) == {"1": "READY", "2": "READY"}
    assert _policy(client, "tiny-vision") == BOTH  # the model configuration reports it
    version, oldest = infer(client, image, "1")
    assert version == "1" and not np.allclose(oldest, newest)
    assert infer(client, image)[0] == "2"  # no version: the newest READY one
    # Statistics without a version are the newest READY version's, as inference is.
    assert statistics(client) == statistics(client, "2") != statistics(client, "1")
    assert statistics(client)[0] == "2" and statistics(client, "1")[0] == "1"

    # Back to the newest only: version 1 drains and is unloaded.
    client.load_model("tiny-vision", config=json.dumps({"version_policy": {"latest": {"num_versions": 1}}}))
    assert states(client) == {"1": "UNAVAILABLE", "2": "READY"}
    client.unload_model("tiny-vision")
    assert states(client) == {"1": "UNAVAILABLE", "2": "UNAVAILABLE"}
    assert not client.is_model_ready("tiny-vision")
    assert refusal(lambda: infer(client, image)).status() == not_found
    assert client.is_model_ready("tiny-mlm")  # other models untouched


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_unknown_models_and_versions(server: RunningServer, transport: str) -> None:
    client = triton_http(server) if transport == "http" else triton_grpc(server)
    not_found = "404" if transport == "http" else "StatusCode.NOT_FOUND"
    for call in (lambda: client.load_model("nope"), lambda: client.unload_model("nope")):
        error = refusal(call)
        assert error.status() == not_found and "'nope'" in error.message()
    if transport == "http":  # tritonclient.http reads any non-200 as "not ready"
        assert not client.is_model_ready("nope") and not client.is_model_ready("tiny-mlm", "3")
    else:
        assert refusal(lambda: client.is_model_ready("nope")).status() == not_found
        assert refusal(lambda: client.is_model_ready("tiny-mlm", "3")).status() == not_found
    error = refusal(lambda: client.get_model_metadata("tiny-mlm", model_version="3"))
    assert error.status() == not_found and "has no version '3'" in error.message()
    error = refusal(lambda: client.load_model("tiny-mlm", config='{"version_policy": "newest"}'))
    assert "version policy" in error.message()


def test_index_ready_only_and_models_page(server: RunningServer) -> None:
    with server.client() as http:
        ready = http.post("/v2/repository/index", json={"ready": True}).json()
        models = http.get("/models").json()
    assert {(e["name"], e["state"]) for e in ready} == {("tiny-mlm", "READY")}
    assert {(v["name"], v["version"], v["state"]) for v in models["versions"]} >= {("tiny-mlm", "1", "READY")}
    assert [m["version"] for m in models["models"] if m["name"] == "tiny-mlm"] == ["1"]


def test_load_and_unload_need_explicit_mode(start_server: Any, repo: Path) -> None:
    server = start_repository_server(start_server, model_repository=repo)
    client = triton_http(server)
    assert states(client) == {"1": "UNAVAILABLE", "2": "READY"}  # none: latest:1 at start-up
    error = refusal(lambda: client.load_model("tiny-vision"))
    assert error.status() == "400" and "GMLP_MODEL_CONTROL=explicit" in error.message()
    server.stop()
