"""A broken version 2 deployed into a watched repository is refused, with the reason in the index,
while version 1 keeps answering every request: a truncated ONNX file, a graph whose answers moved
away from its export's recorded check, a tokenizer that does not belong to the model, and a
half-copied directory (no config.json yet), which is never even loaded."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.repository_servers import (
    Load,
    add_version,
    start_repository_server,
    version_reasons,
    versioned_repository,
)
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)


def _truncated_onnx(good: Path, other: Path, out: Path) -> None:
    shutil.copytree(other, out)
    data = (out / "model.onnx").read_bytes()
    (out / "model.onnx").write_bytes(data[: len(data) // 2])


def _answers_moved(good: Path, other: Path, out: Path) -> None:
    """Version 2's graph under version 1's recorded check: its answers are not the recorded ones."""
    shutil.copytree(other, out)
    shutil.copyfile(good / "check.npz", out / "check.npz")


def _half_copied(good: Path, other: Path, out: Path) -> None:
    out.mkdir()
    shutil.copyfile(other / "model.onnx", out / "model.onnx")


def _mismatched_tokenizer(mlm: Path, out: Path) -> None:
    from tokenizers import Tokenizer

    shutil.copytree(mlm, out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.add_tokens(["retrained-word", "another-new-word"])  # ids beyond the model's vocabulary
    tokenizer.save(str(out / "tokenizer.json"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_vision_served: Path, tiny_mlm_served: Path) -> Path:
    return versioned_repository(
        tmp_path_factory.mktemp("watched"),
        {"tiny-vision": {1: tiny_vision_served}, "tiny-mlm": {1: tiny_mlm_served}},
    )


@pytest.fixture(scope="module")
def server(start_server: Any, repo: Path) -> RunningServer:
    return start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1
    )


VISION_CASES: dict[str, tuple[Callable[[Path, Path, Path], None], str]] = {
    "truncated ONNX": (_truncated_onnx, "load failed"),
    "answers moved": (_answers_moved, "differs from the export's recorded check"),
    "half-copied": (_half_copied, "has no config.json yet"),
}


@pytest.mark.parametrize("case", sorted(VISION_CASES))
def test_a_broken_version_is_refused_and_version_1_keeps_answering(
    server: RunningServer,
    repo: Path,
    tmp_path: Path,
    tiny_vision_served: Path,
    tiny_vision_v2_served: Path,
    cifar_images: list[bytes],
    case: str,
) -> None:
    make, reason = VISION_CASES[case]
    broken = tmp_path / "broken"
    make(tiny_vision_served, tiny_vision_v2_served, broken)
    loads = server.metric("gmlp_model_version_loads_total", model="tiny-vision")
    refusals = server.metric("gmlp_model_version_refusals_total", model="tiny-vision", reason="load_failed")
    with Load(server, cifar_images[0]) as load:
        load.wait_for_answers(20)
        add_version(repo, "tiny-vision", 2, broken)
        server.wait_for(lambda: reason in version_reasons(server, "tiny-vision").get("2", ""), 60)
        load.wait_for_answers(40)  # several more scans: still refused, still not retried
        assert reason in version_reasons(server, "tiny-vision")["2"]
        with server.client() as client:
            health = client.get("/health/ready")
        assert health.status_code == 200  # version 1 serves: the server stays ready
        assert ("tiny-vision 2" in health.json().get("detail", "")) == (case != "half-copied")
        shutil.rmtree(repo / "tiny-vision" / "2")
        server.wait_for(lambda: "2" not in version_reasons(server, "tiny-vision"), 30)
    assert load.failures == []
    assert {a["model_version"] for kind, a in load.answers if kind == "v2"} == {"1"}
    assert server.metric("gmlp_model_version_loads_total", model="tiny-vision") == loads  # nothing loaded
    refused = server.metric("gmlp_model_version_refusals_total", model="tiny-vision", reason="load_failed")
    assert refused - refusals == (0 if case == "half-copied" else 1)  # refused once, never retried


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(
    server: RunningServer, repo: Path, tmp_path: Path, tiny_mlm_served: Path
) -> None:
    _mismatched_tokenizer(tiny_mlm_served, tmp_path / "broken")
    add_version(repo, "tiny-mlm", 2, tmp_path / "broken")
    server.wait_for(lambda: "tokenizer has ids up to" in version_reasons(server, "tiny-mlm").get("2", ""), 60)
    with server.client() as client:
        answer = client.post("/fill-mask", json={"text": "the [MASK] sat.", "model": "tiny-mlm"})
        assert answer.status_code == 200
        assert client.get("/v2/models/tiny-mlm/versions/2/ready").status_code == 400  # known, not ready
        assert client.get("/v2/models/tiny-mlm/versions/1/ready").status_code == 200
        pinned = client.post("/v2/models/tiny-mlm/versions/2/infer", json={"inputs": []})
    assert pinned.status_code == 503 and "tokenizer" in pinned.json()["error"]
