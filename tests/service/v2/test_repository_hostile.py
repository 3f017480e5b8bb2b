"""Real servers over repositories holding broken directories (tests/support/broken_dirs.py): in
poll mode they appear while the server runs, are listed UNAVAILABLE with their reasons (index over
REST and gRPC, /models, the problems gauge), a model deployed afterwards still loads, and the
server still drains and stops; in explicit mode the server starts beside them, loads the healthy
models, and a load of a broken one answers a 4xx naming what is wrong. Every door a version string
enters answers 4xx / NOT_FOUND / INVALID_ARGUMENT to every string that is not a version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from contract.repository import VersionError, parse_version
from support.broken_dirs import BROKEN
from support.repository_servers import (
    add_version,
    control_headers,
    start_repository_server,
    triton_grpc,
    triton_http,
    version_states,
    versioned_repository,
)
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)

DEPLOYED_WHILE_POLLING = [
    "config not UTF-8",
    "config nested deep",
    "version superscript",
    "version not UTF-8",
    "duplicate flat names",
    "flat without model file",
    "labels linked out",
    "variant absolute",
    "symlink loops",
    "file for directory",
    "name not UTF-8",
    "policy not UTF-8",
]


def _index(server: RunningServer) -> list[dict[str, str]]:
    with server.client() as client:
        response = client.post("/v2/repository/index", headers=control_headers())
    assert response.status_code == 200, response.text
    return list(response.json())


def _reasons(server: RunningServer) -> str:
    return "\n".join(e["reason"] for e in _index(server) if e["state"] == "UNAVAILABLE")


def test_poll_mode_lists_broken_directories_and_keeps_loading(
    start_server: Any,
    tmp_path: Path,
    tiny_vision_served: Path,
    tiny_mlm_served: Path,
    cifar_images: list[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    server = start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1
    )
    for case in DEPLOYED_WHILE_POLLING:
        BROKEN[case][0](repo, tiny_vision_served)
    server.wait_for(lambda: all(BROKEN[c][1] in _reasons(server) for c in DEPLOYED_WHILE_POLLING), 60)

    add_version(repo, "fresh", 1, tiny_mlm_served)  # deployed after them: the poller still works
    http, grpc = triton_http(server), triton_grpc(server)
    server.wait_for(lambda: version_states(http, "fresh") == {"1": "READY"}, 60)
    with server.client() as client:
        assert (
            client.post("/fill-mask", json={"text": "the [MASK] sat.", "model": "fresh"}).status_code == 200
        )
        assert client.post("/classify", content=cifar_images[0]).status_code == 200
        listed = {(v["name"], v["state"]) for v in client.get("/models").json()["versions"]}
        superscript = client.get(f"/v2/models/tiny-vision/versions/{quote('²')}/ready")
    assert {("raw", "UNAVAILABLE"), ("twin", "UNAVAILABLE"), ("hollow", "UNAVAILABLE")} <= listed
    assert superscript.status_code == 404 and "ASCII digits" in superscript.json()["error"]
    grpc_index = grpc.get_model_repository_index(as_json=True)["models"]
    assert {e["name"] for e in grpc_index} >= {"raw", "twin", "hollow", "ruled", "odd-versions", "fresh"}
    assert "ruled" not in {e["name"] for e in _index(server) if e["state"] == "READY"}  # held, not loaded
    assert server.metric("gmlp_repository_problems") >= len(DEPLOYED_WHILE_POLLING)
    assert server.metric("gmlp_repository_poller_restarts_total") == 0
    logged = [r.getMessage() for r in caplog.records if r.name == "service.lifecycle.poller"]
    assert any("unreadable config" in line for line in logged) and len(logged) == len(set(logged))
    server.stop()  # drains and stops: the poller is cancelled, not dead


EXPLICIT_REFUSALS = {
    "raw": "unreadable config",
    "twin": "2 directories claim the model name 'twin'",
    "hollow": "variant files missing",
    "ruled": "policy.json",
    "field": "inside the model's directory",
}


@pytest.fixture(scope="module")
def explicit_server(
    start_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_vision_served: Path,
    tiny_mlm_served: Path,
) -> RunningServer:
    repo = versioned_repository(
        tmp_path_factory.mktemp("hostile"),
        {"tiny-vision": {1: tiny_vision_served}, "tiny-mlm": {1: tiny_mlm_served}},
    )
    for case in ("config not UTF-8", "duplicate flat names", "flat without model file", "policy not UTF-8"):
        BROKEN[case][0](repo, tiny_vision_served)
    BROKEN["labels absolute"][0](repo, tiny_vision_served)  # flat "field": labels /etc/passwd
    BROKEN["version superscript"][0](repo, tiny_vision_served)
    return start_repository_server(
        start_server, model_repository=repo, model_control="explicit", load_model="tiny-vision"
    )


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_explicit_mode_starts_beside_broken_directories(
    explicit_server: RunningServer, transport: str, cifar_images: list[bytes]
) -> None:
    client = triton_http(explicit_server) if transport == "http" else triton_grpc(explicit_server)
    refused = "400" if transport == "http" else "StatusCode.INVALID_ARGUMENT"
    client.load_model("tiny-mlm")  # a healthy model loads beside them
    for name, words in EXPLICIT_REFUSALS.items():
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(name)
        assert caught.value.status() == refused and words in caught.value.message(), caught.value.message()
    with explicit_server.client() as http:
        assert http.post("/classify", content=cifar_images[0]).status_code == 200
        assert http.post("/fill-mask", json={"text": "a [MASK].", "model": "tiny-mlm"}).status_code == 200
    assert all(EXPLICIT_REFUSALS[n] in _reasons(explicit_server) for n in ("twin", "ruled"))


# -- versions: every door ---------------------------------------------------------------------------

VERSION_TEXTS = st.one_of(
    st.text(min_size=1, max_size=25),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl", "Zs", "Cc"]), min_size=1, max_size=6),
    st.from_regex(r"[+\- 0]?[0-9]{1,30}[ \n]?", fullmatch=True),
    st.sampled_from(["²", "¹", "٣", "1_0", "+1", "-1", " 1", "1 ", "0", "01", "9" * 19, "9" * 400]),
)
REST_PATHS = ("/ready", "", "/config", "/stats")


def _valid(text: str) -> bool:
    try:
        parse_version(text)
    except VersionError:
        return False
    return True


def _only(version: str) -> str:
    """A load call's config whose version policy names `version` alone."""
    return json.dumps({"version_policy": f"specific:{version}"})


def _rest_door(server: RunningServer, version: str) -> list[int]:
    quoted = quote(version, safe="")
    base = f"/v2/models/tiny-vision/versions/{quoted}"
    with server.client() as client:
        statuses = [client.get(base + suffix).status_code for suffix in REST_PATHS]
        statuses.append(client.post(base + "/infer", json={"inputs": []}).status_code)
        load = client.post(
            "/v2/repository/models/tiny-vision/load",
            json={"parameters": {"config": _only(version)}},
            headers=control_headers(),
        )
    return [*statuses, load.status_code]


def _image_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"not an image"], dtype=np.object_))
    return tensor


def _grpc_door(server: RunningServer, version: str) -> list[str]:
    client = triton_grpc(server)
    calls = [
        lambda: client.is_model_ready("tiny-vision", version),
        lambda: client.get_model_metadata("tiny-vision", version),
        lambda: client.get_model_config("tiny-vision", version),
        lambda: client.get_inference_statistics("tiny-vision", version),
        lambda: client.infer("tiny-vision", [_image_input()], model_version=version),
        lambda: client.load_model("tiny-vision", config=_only(version)),
    ]
    codes = []
    for call in calls:
        try:
            call()
            codes.append("OK")
        except InferenceServerException as exc:
            codes.append(str(exc.status()))
    return codes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=VERSION_TEXTS)
def test_no_version_string_gets_a_server_error(explicit_server: RunningServer, version: str) -> None:
    rest, grpc = _rest_door(explicit_server, version), _grpc_door(explicit_server, version)
    assert all(status < 500 for status in rest), (version, rest)
    assert not {"StatusCode.INTERNAL", "StatusCode.UNKNOWN"} & set(grpc), (version, grpc)
    if not _valid(version):
        assert all(400 <= status < 500 for status in rest), (version, rest)
        assert all(code in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT") for code in grpc), grpc
