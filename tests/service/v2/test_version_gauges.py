"""The batcher gauges during a swap: with versions 1 and 2 loaded side by side, gmlp_queue_depth,
gmlp_queue_capacity and gmlp_model_instances have one series per version, each with that version's
own value (requests held in version 2's queue do not show as version 1's), and a retired version's
series go with it instead of staying at their last value."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from support.repository_servers import (
    start_repository_server,
    triton_http,
    v2_image_request,
    version_states,
    versioned_repository,
)
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

GAUGES = ("gmlp_queue_depth", "gmlp_queue_capacity", "gmlp_model_instances")


def _series(server: RunningServer, name: str) -> dict[str, float]:
    """{version: value} of one gauge of tiny-vision."""
    return {
        dict(labels)["version"]: value
        for (sample, labels), value in server.metrics().items()
        if sample == name and dict(labels).get("model") == "tiny-vision"
    }


def _pinned(server: RunningServer, version: str, image: bytes) -> int:
    body, headers = v2_image_request(image)
    with server.client(timeout=60) as client:
        url = f"/v2/models/tiny-vision/versions/{version}/infer"
        return client.post(url, content=body, headers=headers).status_code


def test_two_loaded_versions_each_show_their_own_gauges(
    start_server: Any,
    tmp_path: Path,
    tiny_vision_served: Path,
    tiny_vision_v2_served: Path,
    cifar_images: list[bytes],
) -> None:
    repo = versioned_repository(
        tmp_path / "models", {"tiny-vision": {1: tiny_vision_served, 2: tiny_vision_v2_served}}
    )
    server = start_repository_server(
        start_server,
        model_repository=repo,
        model_control="explicit",
        load_model="tiny-vision",
        version_policy="all",
        max_queue_size=7,
        instances=1,
        max_batch_size=64,
        max_queue_delay_ms=3000.0,  # requests wait in their version's queue until the batch is due
        queue_delay_policy="always",
    )
    assert version_states(triton_http(server), "tiny-vision") == {"1": "READY", "2": "READY"}
    assert _series(server, "gmlp_queue_capacity") == {"1": 7, "2": 7}
    assert _series(server, "gmlp_model_instances") == {"1": 1, "2": 1}
    with ThreadPoolExecutor(3) as pool:
        answers = [pool.submit(_pinned, server, v, cifar_images[0]) for v in ("2", "2", "1")]
        server.wait_for(lambda: _series(server, "gmlp_queue_depth") == {"1": 1, "2": 2}, 30)
        assert [a.result(timeout=60) for a in answers] == [200, 200, 200]
    assert _series(server, "gmlp_queue_depth") == {"1": 0, "2": 0}

    # Version 1 retires: its series go, version 2's stay.
    triton_http(server).load_model("tiny-vision", config=json.dumps({"version_policy": "specific:2"}))
    for gauge in GAUGES:
        assert set(_series(server, gauge)) == {"2"}, gauge
    server.stop()
