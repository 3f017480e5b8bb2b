"""Real servers over repositories whose versions hold graphs with hostile external data
(tests/support/external_graphs.py: out of the directory, absolute, `/dev/zero` with a terabyte's
length, a symlink, a hard link, a FIFO, an offset past the end). In poll mode each such version,
deployed while the server runs, whichever variant holds the graph, is listed UNAVAILABLE with a
reason naming the tensor and the problem, while version 1 of the same model keeps serving and a
model whose data lies in its own folder loads and answers; on OpenVINO in explicit mode a load of
one answers 400 with the reason. The file outside is never read by either."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
from tritonclient.utils import InferenceServerException

from support.broken_dirs import copy_export, release_readers
from support.external_graphs import HOSTILE, INSIDE_NAME, outside_file, untouched
from support.repository_servers import (
    add_version,
    control_headers,
    start_repository_server,
    triton_http,
    v2_image_request,
    version_reasons,
    version_states,
    versioned_repository,
)

pytestmark = pytest.mark.timeout(240)

EXTERNAL = "external data"


def _with_data_beside(served: Path, target: Path) -> Path:
    """A copy of an export whose every graph keeps its weights (every tensor of 1 KiB or more) in
    a file beside it, as onnx saves a model over 2 GB: what a legitimate writer leaves."""
    shutil.copytree(served, target)  # real copies: the data files get one link each
    for graph in sorted(target.glob("*.onnx")):
        model = onnx.load(str(graph))
        onnx.save(model, str(graph), save_as_external_data=True, location=f"{graph.name}.data")
        assert (target / f"{graph.name}.data").stat().st_size > 0
    return target


def _hostile_version(repo: Path, model: str, served: Path, outside: Path, case: str, graph: str) -> str:
    """`model` version 1 (or the next) holding `case`'s graph as file `graph`; its expected words."""
    version = 2 if (repo / model / "1").exists() else 1
    staging = copy_export(served, repo / f".{model}-{version}.partial")
    words = HOSTILE[case](staging, outside, graph)
    (repo / model).mkdir(exist_ok=True)
    staging.rename(repo / model / str(version))
    return words


def test_poll_mode_lists_hostile_external_data_and_keeps_serving(
    start_server: Any, tmp_path: Path, tiny_vision_served: Path, cifar_images: list[bytes]
) -> None:
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    server = start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1
    )
    outside = outside_file(tmp_path)
    expected = {
        f"hostile-{case}": _hostile_version(repo, f"hostile-{case}", tiny_vision_served, outside, case, graph)
        for case in HOSTILE
        for graph in ["model.onnx"]
    }
    # The int8 variant, chosen on a CPU by default; and version 2 of the serving model.
    expected["int8-hard-link"] = _hostile_version(
        repo, "int8-hard-link", tiny_vision_served, outside, "hard-link", "model.int8.onnx"
    )
    linked = _hostile_version(repo, "tiny-vision", tiny_vision_served, outside, "symlink", "model.onnx")
    add_version(repo, "beside", 1, _with_data_beside(tiny_vision_served, tmp_path / "beside"))
    fifos = [p for p in repo.rglob(INSIDE_NAME) if p.is_fifo()]
    http = triton_http(server)

    def listed() -> bool:
        reasons = {name: version_reasons(server, name).get("1", "") for name in expected}
        return all(words in reasons[name] for name, words in expected.items())

    try:
        server.wait_for(listed, 60)
        server.wait_for(lambda: version_states(http, "beside") == {"1": "READY"}, 60)
        server.wait_for(lambda: version_states(http, "tiny-vision").get("2") == "UNAVAILABLE", 30)
        assert linked in version_reasons(server, "tiny-vision")["2"]
        for name in expected:
            reason = version_reasons(server, name)["1"]
            assert EXTERNAL in reason and "tensor 'w'" in reason, reason
            assert version_states(http, name) == {"1": "UNAVAILABLE"}
        assert "model.int8.onnx" in version_reasons(server, "int8-hard-link")["1"]
        assert version_states(http, "tiny-vision")["1"] == "READY"  # still serving
        body, headers = v2_image_request(cifar_images[0])
        with server.client() as client:
            assert client.post("/classify", content=cifar_images[0]).status_code == 200
            answer = client.post("/v2/models/beside/infer", content=body, headers=headers)
            assert answer.status_code == 200, answer.text
        assert untouched(outside)
        server.stop()  # no thread is left waiting on a FIFO
    finally:
        release_readers(fifos)


def test_openvino_explicit_load_of_hostile_external_data_is_refused(
    start_server: Any, tmp_path: Path, tiny_vision_served: Path, cifar_images: list[bytes]
) -> None:
    pytest.importorskip("openvino")
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    outside = outside_file(tmp_path)
    cases = ["dot-dot", "symlink", "hard-link", "fifo"]
    expected = {
        f"hostile-{case}": _hostile_version(
            repo, f"hostile-{case}", tiny_vision_served, outside, case, "model.onnx"
        )
        for case in cases
    }
    fifos = [p for p in repo.rglob(INSIDE_NAME) if p.is_fifo()]
    try:
        server = start_repository_server(
            start_server,
            model_repository=repo,
            model_control="explicit",
            load_model="tiny-vision",
            backend="openvino",
        )
        client = triton_http(server)
        for name, words in expected.items():
            with pytest.raises(InferenceServerException) as caught:
                client.load_model(name)
            message = caught.value.message()
            assert caught.value.status() == "400" and words in message and EXTERNAL in message, message
        with server.client() as http:
            models = http.get("/models").json()["models"]
            assert [(m["name"], m["provider"]) for m in models] == [("tiny-vision", "OpenVINO CPU")]
            assert http.post("/classify", content=cifar_images[0]).status_code == 200
            index = http.post("/v2/repository/index", headers=control_headers()).json()
        reasons = {e["name"]: e.get("reason", "") for e in index}
        assert all(words in reasons[name] for name, words in expected.items()), reasons
        assert untouched(outside)
    finally:
        release_readers(fifos)
