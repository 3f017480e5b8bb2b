"""Swaps under load: a bounded load of /classify and v2 requests runs while version 2 (other weights,
so answers tell the versions apart) is deployed into a watched repository and removed again, and
while versions are switched through the repository API; not one request may fail, and afterwards
the answers come from the version that was switched to."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.repository_servers import (
    Load,
    add_version,
    start_repository_server,
    triton_http,
    version_states,
    versioned_repository,
)
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)


def _versions_answering(load: Load, start: int, end: int | None = None) -> set[str]:
    return {answer["model_version"] for kind, answer in load.answers[start:end] if kind == "v2"}


def _classify_answers(load: Load, start: int, end: int | None = None) -> list[Any]:
    return [answer["predictions"] for kind, answer in load.answers[start:end] if kind == "classify"]


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same answer up to the rounding a batch's size makes (scores per label, top 10 of 10)."""
    scores_a, scores_b = ({p["label"]: p["score"] for p in x} for x in (a, b))
    return scores_a.keys() == scores_b.keys() and all(abs(scores_a[k] - scores_b[k]) < 1e-4 for k in scores_a)


def _served_by(server: RunningServer) -> dict[str, float]:
    return {
        labels[1][1]: value
        for (name, labels), value in server.metrics().items()
        if name == "gmlp_model_version_requests_total" and dict(labels).get("model") == "tiny-vision"
    }


def test_new_version_deployed_into_a_watched_repository(
    start_server: Any,
    tmp_path: Path,
    tiny_vision_served: Path,
    tiny_vision_v2_served: Path,
    cifar_images: list[bytes],
) -> None:
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    server = start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1
    )
    client = triton_http(server)
    with Load(server, cifar_images[0]) as load:
        load.wait_for_answers(40)
        before = load.count()
        add_version(repo, "tiny-vision", 2, tiny_vision_v2_served)
        server.wait_for(
            lambda: version_states(client, "tiny-vision") == {"1": "UNAVAILABLE", "2": "READY"}, 60
        )
        swapped = load.count() + 4  # answers still on their way from version 1 (one per thread)
        load.wait_for_answers(60)
        rollback = load.count()
        shutil.rmtree(repo / "tiny-vision" / "2")  # rolled back: version 1 loads again, 2 goes
        server.wait_for(lambda: version_states(client, "tiny-vision") == {"1": "READY"}, 60)
        rolled_back = load.count() + 4
        load.wait_for_answers(40)
    assert load.failures == []
    assert _versions_answering(load, 0)  # the load did reach the v2 API
    assert _versions_answering(load, swapped, rollback) == {"2"}
    assert _versions_answering(load, rolled_back) == {"1"}
    assert "1" in {a["model_version"] for kind, a in load.answers[:before] if kind == "v2"}
    old, new = _classify_answers(load, 0, before), _classify_answers(load, swapped, rollback)
    assert old and new and all(_same(p, new[0]) for p in new) and not _same(old[0], new[0])
    assert all(_same(p, old[0]) for p in _classify_answers(load, rolled_back))
    assert set(_served_by(server)) == {"1", "2"}
    server.stop()


@pytest.fixture
def two_versions(
    start_server: Any, tmp_path: Path, tiny_vision_served: Path, tiny_vision_v2_served: Path
) -> Callable[[int], RunningServer]:
    """Factory: an explicit-mode server over versions 1 and 2, serving version 1."""

    def start(max_loaded: int) -> RunningServer:
        repo = versioned_repository(
            tmp_path / "models", {"tiny-vision": {1: tiny_vision_served, 2: tiny_vision_v2_served}}
        )
        return start_repository_server(
            start_server,
            model_repository=repo,
            model_control="explicit",
            load_model="tiny-vision",
            version_policy="specific:1",
            max_loaded_versions=max_loaded,
        )

    return start


def test_versions_switched_through_the_repository_api(
    two_versions: Callable[[int], RunningServer], cifar_images: list[bytes]
) -> None:
    server = two_versions(2)
    client = triton_http(server)
    only = {v: json.dumps({"version_policy": {"specific": {"versions": [v]}}}) for v in (1, 2)}
    with Load(server, cifar_images[0]) as load:
        load.wait_for_answers(40)
        before = load.count()
        client.load_model("tiny-vision", config=only[2])  # returns once version 1 drained
        assert version_states(client, "tiny-vision") == {"1": "UNAVAILABLE", "2": "READY"}
        on_two = load.count() + 4
        load.wait_for_answers(40)
        second = load.count()
        client.load_model("tiny-vision", config=only[1])  # and back (version 2 drains)
        assert version_states(client, "tiny-vision") == {"1": "READY", "2": "UNAVAILABLE"}
        back = load.count() + 4
        load.wait_for_answers(40)
    assert load.failures == []
    assert _versions_answering(load, on_two, second) == {"2"} and _versions_answering(load, back) == {"1"}
    first, last = _classify_answers(load, 0, before), _classify_answers(load, back)
    assert first, "no /classify answer before the swap"
    assert last, "no /classify answer after the swap back"
    assert all(_same(p, first[0]) for p in last)
    server.stop()


def test_a_load_beyond_the_version_limit_is_refused_and_changes_nothing(
    two_versions: Callable[[int], RunningServer], cifar_images: list[bytes]
) -> None:
    from tritonclient.utils import InferenceServerException

    server = two_versions(1)
    client = triton_http(server)
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("tiny-vision", config=json.dumps({"version_policy": "specific:2"}))
    assert refused.value.status() == "400" and "GMLP_MAX_LOADED_VERSIONS=1" in refused.value.message()
    assert version_states(client, "tiny-vision") == {"1": "READY", "2": "UNAVAILABLE"}
    with server.client() as http:
        assert http.post("/classify", content=cifar_images[0]).status_code == 200
    assert (
        server.metric("gmlp_model_version_refusals_total", model="tiny-vision", reason="too_many_versions")
        == 1
    )
    assert np.isfinite(server.metric("gmlp_model_version_loads_total", model="tiny-vision"))
    server.stop()
