"""The HTTP API end to end: a real uvicorn server, real ORT sessions on the tiny exported models."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from contract.cpu import cpu_flags
from contract.image import ImageTransform
from contract.spec import read_spec
from service.engine.backends import auto_backend
from service.http.schemas import ClassifyResponse, FillMaskResponse

if TYPE_CHECKING:  # at run time the harness is loaded by pytest as a plugin (assertion rewriting)
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(max_upload_bytes=LIMIT, max_image_pixels=1_000_000)


def jpeg(image: bytes) -> dict[str, Any]:
    return {"content": image, "headers": {"content-type": "image/jpeg"}}


def expected_probs(served: Path, variant_file: str, image: bytes) -> np.ndarray:
    """What the service should answer, computed directly with ORT (no batching, no HTTP)."""
    spec = read_spec(served)
    assert spec is not None
    pixels = ImageTransform.from_config(spec.config["preprocessing"], 10**8, (32, 32))(image)
    session = ort.InferenceSession(str(served / variant_file), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixel_values": pixels[None]})[0][0].astype(np.float64)
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def test_classify_multipart_and_raw_body(
    server: RunningServer, cifar_images: list[bytes], tiny_vision_served: Path
) -> None:
    with server.client() as client:
        multipart = client.post("/classify", files={"file": ("x.jpg", cifar_images[0], "image/jpeg")})
        raw = client.post("/classify", params={"top_k": 10, "model": "tiny-vision"}, **jpeg(cifar_images[0]))
    assert multipart.status_code == raw.status_code == 200
    body = raw.json()
    ClassifyResponse.model_validate_json(raw.content, strict=True)  # the documented schema, exactly
    assert body["model"] == "tiny-vision"
    scores = [p["score"] for p in body["predictions"]]
    assert len(scores) == 10 and scores == sorted(scores, reverse=True)
    assert sum(scores) == pytest.approx(1.0, abs=1e-6)
    assert multipart.json()["predictions"] == body["predictions"][:5]  # top_k defaults to 5
    labels = json.loads((tiny_vision_served / "labels.json").read_text())
    probs = expected_probs(tiny_vision_served, "model.int8.onnx", cifar_images[0])  # int8: the CPU default
    for p in body["predictions"]:
        assert p["score"] == pytest.approx(probs[labels.index(p["label"])], abs=1e-6)


def test_classify_raw_body_without_an_image_type(server: RunningServer, cifar_images: list[bytes]) -> None:
    """No content type, generic bytes, curl's default: the format is recognised from the bytes."""
    with server.client() as client:
        typed = client.post("/classify", **jpeg(cifar_images[4]))
        answers = [
            client.post("/classify", content=cifar_images[4], headers=headers)
            for headers in ({}, {"content-type": "application/octet-stream"})
        ]
    assert typed.status_code == 200 and all(a.status_code == 200 for a in answers)
    assert all(a.json() == typed.json() for a in answers)


def test_fill_mask(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/fill-mask", json={"text": "the [MASK] sat on the [MASK].", "top_k": 3})
        targeted = client.post(
            "/fill-mask", json={"text": "a [MASK] day", "targets": ["sunny", "rainy"], "model": "tiny-mlm"}
        )
    assert response.status_code == 200, response.text
    FillMaskResponse.model_validate_json(response.content, strict=True)
    body = response.json()
    assert body["model"] == "tiny-mlm" and len(body["predictions"]) == 2
    for preds, template in zip(
        body["predictions"], ("the {} sat on the [MASK].", "the [MASK] sat on the {}."), strict=True
    ):
        assert len(preds) == 3
        assert [p["score"] for p in preds] == sorted((p["score"] for p in preds), reverse=True)
        for p in preds:
            assert set(p) == {"score", "token", "token_str", "sequence"} and isinstance(p["token"], int)
            if not p["token_str"].startswith("##"):
                assert p["sequence"] == template.format(p["token_str"])
    assert targeted.status_code == 200
    assert {p["token_str"] for p in targeted.json()["predictions"][0]} == {"sunny", "rainy"}


def test_models_and_defaults(server: RunningServer) -> None:
    with server.client() as client:
        body = client.get("/models").json()
    models = {m["name"]: m for m in body["models"]}
    assert body["defaults"] == {"image-classification": "tiny-vision", "fill-mask": "tiny-mlm"}
    assert models["tiny-vision"]["task"] == "image-classification" and models["tiny-vision"]["n"] == 64
    assert models["tiny-mlm"]["n"] == 32
    for m in models.values():
        assert m["variant"] == "int8" and m["provider"] == "CPUExecutionProvider" and m["ready"]
        assert m["batching"] == {
            "max_batch_size": 8,
            "max_queue_delay_ms": 5.0,
            "max_queue_size": 256,
            "queue_delay_policy": "arriving",
        }


def test_lone_threads_follow_the_rule_unless_given(server: RunningServer, start_server: Any) -> None:
    """Left unset (this module's server), a lone run's threads follow the fixed rule of the model's
    shapes: the tiny models' blocks are far below it, so 0; given, they are used as given."""
    with server.client() as client:
        assert {m["lone_threads"] for m in client.get("/models").json()["models"]} == {0}
    given = start_server(lone_threads=3)
    with given.client() as client:
        assert {m["lone_threads"] for m in client.get("/models").json()["models"]} == {3}


def test_the_default_backend_is_autos_choice_for_this_cpu(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset (the suite pins ONNX Runtime in its environment, tests/conftest.py), the backend is
    `auto`: OpenVINO where this CPU has bf16 instructions and the package is installed, else ONNX
    Runtime, as GET /models reports the provider that runs each model."""
    monkeypatch.delenv("GMLP_BACKEND")
    installed = importlib.util.find_spec("openvino") is not None
    expected = auto_backend("cpu", cpu_flags(), installed)
    server = start_server()
    assert server.settings.backend == "auto"
    with server.client() as client:
        providers = {m["provider"] for m in client.get("/models").json()["models"]}
    assert providers == {"OpenVINO CPU" if expected == "openvino" else "CPUExecutionProvider"}


def _png(size: tuple[int, int], mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, "PNG")
    return buf.getvalue()


BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("not an image", "/classify", jpeg(b"GIF89a but not really"), 422, "invalid_image"),
    ("empty body", "/classify", jpeg(b""), 422, "empty_image"),
    (
        "wrong content type",
        "/classify",
        {"content": b"x", "headers": {"content-type": "text/plain"}},
        415,
        "unsupported_media_type",
    ),
    ("no content type, not an image", "/classify", {"content": b"x"}, 422, "invalid_image"),
    (
        "multipart without file",
        "/classify",
        {"files": {"image": ("x.png", _png((4, 4)), "image/png")}},
        422,
        "missing_file",
    ),
    (
        "unsupported format",
        "/classify",
        {"content": b"II*\x00" + b"\x00" * 64, "headers": {"content-type": "image/tiff"}},
        422,
        "invalid_image",
    ),
    ("top_k zero", "/classify?top_k=0", jpeg(_png((4, 4))), 422, "invalid_request"),
    ("top_k above labels", "/classify?top_k=11", jpeg(_png((4, 4))), 422, "invalid_top_k"),
    ("top_k not a number", "/classify?top_k=many", jpeg(_png((4, 4))), 422, "invalid_request"),
    ("unknown model", "/classify?model=resnet", jpeg(_png((4, 4))), 404, "model_not_found"),
    ("model of another task", "/classify?model=tiny-mlm", jpeg(_png((4, 4))), 422, "wrong_task"),
    (
        "decompression bomb",
        "/classify",
        {"content": _png((2000, 2000), "1"), "headers": {"content-type": "image/png"}},
        413,
        "image_too_large",
    ),
    (
        "bad json",
        "/fill-mask",
        {"content": b"{text:", "headers": {"content-type": "application/json"}},
        422,
        "invalid_request",
    ),
    ("json not an object", "/fill-mask", {"json": ["[MASK]"]}, 422, "invalid_request"),
    (
        "empty json body",
        "/fill-mask",
        {"content": b"", "headers": {"content-type": "application/json"}},
        422,
        "empty_body",
    ),
    ("form instead of json", "/fill-mask", {"data": {"text": "[MASK]"}}, 415, "unsupported_media_type"),
    ("missing text", "/fill-mask", {"json": {"top_k": 3}}, 422, "invalid_request"),
    ("unknown field", "/fill-mask", {"json": {"text": "[MASK]", "topk": 3}}, 422, "invalid_request"),
    ("no mask", "/fill-mask", {"json": {"text": "nothing to fill"}}, 422, "invalid_request"),
    ("no mask token", "/fill-mask", {"json": {"text": "[MASK ] [mask]"}}, 422, "invalid_request"),
    ("too many masks", "/fill-mask", {"json": {"text": "[MASK] " * 17}}, 422, "too_many_masks"),
    ("text too long", "/fill-mask", {"json": {"text": "word " * 40 + "[MASK]"}}, 422, "text_too_long"),
    ("top_k too large", "/fill-mask", {"json": {"text": "[MASK]", "top_k": 101}}, 422, "invalid_request"),
    ("empty targets", "/fill-mask", {"json": {"text": "[MASK]", "targets": []}}, 422, "invalid_request"),
    ("empty target", "/fill-mask", {"json": {"text": "[MASK]", "targets": [""]}}, 422, "invalid_request"),
    ("unknown mlm", "/fill-mask", {"json": {"text": "[MASK]", "model": "bert"}}, 404, "model_not_found"),
    (
        "classifier as mlm",
        "/fill-mask",
        {"json": {"text": "[MASK]", "model": "tiny-vision"}},
        422,
        "wrong_task",
    ),
    ("body over the limit", "/fill-mask", {"json": {"text": "x" * LIMIT}}, 413, "payload_too_large"),
]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "code"), [r[1:] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS]
)
def test_bad_requests_get_a_4xx_with_a_json_error(
    server: RunningServer, path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    with server.client() as client:
        response = client.post(path, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and len(error["message"]) > 10


def test_bad_query_names_the_parameter_and_the_rule(server: RunningServer, cifar_images: list[bytes]) -> None:
    with server.client() as client:
        zero = client.post("/classify?top_k=0", **jpeg(cifar_images[0]))
        word = client.post("/classify?top_k=many&model=tiny-vision", **jpeg(cifar_images[0]))
        extra = client.post("/classify?top_k=2&unknown=1", **jpeg(cifar_images[0]))
    (detail,) = zero.json()["error"]["details"]
    assert detail["loc"] == ["query", "top_k"] and detail["type"] == "greater_than_equal"
    assert "query.top_k" in zero.json()["error"]["message"]
    assert word.json()["error"]["details"][0]["type"] == "int_parsing"
    assert extra.status_code == 200 and len(extra.json()["predictions"]) == 2  # unknown ones ignored


def test_unknown_routes_and_methods_use_the_same_error_shape(server: RunningServer) -> None:
    with server.client() as client:
        missing, wrong_method = client.get("/nowhere"), client.get("/classify")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


def _raw_http(server: RunningServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        for _ in range(1000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"}" in chunk:
                break
        return b"".join(chunks)


def test_upload_limit_from_the_header_before_reading_the_body(server: RunningServer) -> None:
    head = (
        b"POST /classify HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: image/jpeg\r\nContent-Length: 999999999\r\n\r\n"
    )
    answer = _raw_http(server, head)  # the body is never sent: the answer must not wait for it
    assert answer.startswith(b"HTTP/1.1 413") and b"payload_too_large" in answer


def test_upload_limit_on_the_bytes_actually_read(server: RunningServer) -> None:
    def chunks() -> Any:  # chunked transfer: no Content-Length to check up front
        for _ in range(5):
            yield b"\xff" * (LIMIT // 4)

    with server.client() as client:
        response = client.post("/classify", content=chunks(), headers={"content-type": "image/jpeg"})
        multipart = client.post("/classify", files={"file": ("big.jpg", b"\xff" * (LIMIT + 1), "image/jpeg")})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    assert multipart.status_code == 413


def test_metrics(server: RunningServer, cifar_images: list[bytes]) -> None:
    with server.client() as client:
        assert client.post("/classify", **jpeg(cifar_images[1])).status_code == 200
        client.get("/no/such/path")
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for needle in (
        'gmlp_http_requests_total{method="POST",route="/classify",status="200"}',
        'gmlp_http_requests_total{method="GET",route="<unmatched>",status="404"}',
        'gmlp_http_request_duration_seconds_bucket{le="0.1",method="POST",route="/classify",status="200"}',
        'gmlp_queue_depth{model="tiny-vision",version="1"} 0.0',
        'gmlp_queue_depth{model="tiny-mlm",version="1"} 0.0',
        'gmlp_batch_size_bucket{le="8.0",model="tiny-vision"}',
        'gmlp_queue_wait_seconds_count{model="tiny-vision"}',
        'gmlp_inference_seconds_count{model="tiny-vision"}',
        'gmlp_model_ready{model="tiny-mlm"} 1.0',
        "# TYPE gmlp_rejections_total counter",
    ):
        assert needle in text, needle
    buckets = [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("gmlp_batch_size_bucket") and "tiny-vision" in line
    ]
    assert buckets == ["1.0", "2.0", "4.0", "8.0", "+Inf"]
    assert "/no/such/path" not in text  # raw paths never become labels


def test_openapi_documents_both_tasks(server: RunningServer) -> None:
    with server.client() as client:
        spec = client.get("/openapi.json").json()
    classify = spec["paths"]["/classify"]["post"]
    assert {"multipart/form-data", "image/*"} <= set(classify["requestBody"]["content"])
    assert (
        "examples"
        in spec["paths"]["/fill-mask"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    )
    assert "422" in classify["responses"] and "/v2/models/{name}/infer" in spec["paths"]


def test_container_healthcheck_probe(server: RunningServer) -> None:
    """`python -m service.healthcheck` (the Dockerfile's HEALTHCHECK) says ready only when it is."""
    import subprocess
    import sys

    def probe(port: int) -> int:
        env = {**os.environ, "GMLP_PORT": str(port)}
        return subprocess.run([sys.executable, "-m", "service.healthcheck"], env=env, timeout=30).returncode

    assert probe(server.port) == 0
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        free_port = unused.getsockname()[1]
    assert probe(free_port) == 1


def test_classify_base64_json(server: RunningServer, cifar_images: list[bytes]) -> None:
    import base64

    encoded = base64.b64encode(cifar_images[1]).decode()
    with server.client() as client:
        multipart = client.post("/classify", files={"file": ("x.jpg", cifar_images[1], "image/jpeg")})
        plain = client.post("/classify", json={"image": encoded})
        data_url = client.post(
            "/classify", params={"top_k": 2}, json={"image": "data:image/jpeg;base64," + encoded}
        )
        bad = client.post("/classify", json={"image": "not base64!"})
        wrong_field = client.post("/classify", json={"img": encoded})
    assert plain.status_code == data_url.status_code == 200, plain.text
    assert plain.json()["predictions"] == multipart.json()["predictions"]
    assert data_url.json()["predictions"] == multipart.json()["predictions"][:2]
    assert bad.status_code == 422 and "image: String should match pattern" in bad.json()["error"]["message"]
    assert wrong_field.status_code == 422 and wrong_field.json()["error"]["code"] == "invalid_request"
