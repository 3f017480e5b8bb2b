"""The per-task default model follows the version table: a model loaded or unloaded through the
repository API (with the operator's key) becomes, or stops being, the model a task route uses
when a request names none."""

from __future__ import annotations

from typing import Any

import pytest

from support.repository_servers import start_repository_server
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

VISION, MLM = "image-classification", "fill-mask"


def defaults(server: RunningServer) -> dict[str, Any]:
    with server.client() as client:
        answer = client.get("/models")
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["defaults"])


def test_the_default_follows_loads_and_unloads(start_server: Any, cifar_images: list[bytes]) -> None:
    server = start_repository_server(start_server, model_control="explicit", load_model="tiny-mlm")
    assert defaults(server) == {VISION: None, MLM: "tiny-mlm"}
    with server.client() as client:
        refused = client.post("/classify", content=cifar_images[0])
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "no_model", refused.text

        assert client.post("/v2/repository/models/tiny-vision/load").status_code == 200
        assert defaults(server) == {VISION: "tiny-vision", MLM: "tiny-mlm"}
        served = client.post("/classify", content=cifar_images[0])
        assert served.status_code == 200 and served.json()["model"] == "tiny-vision", served.text

        assert client.post("/v2/repository/models/tiny-mlm/unload").status_code == 200
        assert defaults(server) == {VISION: "tiny-vision", MLM: None}
        refused = client.post("/fill-mask", json={"text": "a [MASK] b"})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "no_model", refused.text
