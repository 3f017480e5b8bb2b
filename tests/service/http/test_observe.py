"""Request ids, Server-Timing and JSON logs, on real servers (in a thread, and as a process).

Request ids: the client's when short and plain, else generated (never the odd one echoed), on
every answer, refusals before any route included, and in the v2 `id` when the client sent none.
JSON logs: `gmlp serve --log-format json` as a real process, from start-up to shutdown, with its
access log, gRPC on and tracing on, every line of its output parsed.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import pytest

from gmlp.server_process import free_port, gmlp_serve, http_get
from service.engine.request_context import MAX_REQUEST_ID_LENGTH
from support.otlp_sink import OtlpSink
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

GENERATED = re.compile(r"[0-9a-f]{32}")
TIMING = re.compile(r"queue;dur=(\d+\.\d), infer;dur=(\d+\.\d), total;dur=(\d+\.\d)")


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(max_upload_bytes=64 * 1024)


@pytest.fixture(scope="module")
def untimed(start_server: Any) -> RunningServer:
    return start_server(server_timing=False)


@pytest.mark.parametrize(
    "given", ["abc-123", "0b6f1f9e-1c7a-4b43-9d1e-1b6c3e2f7a10", "svc.a:b/c@d+e=f_g", "x" * 128]
)
def test_an_acceptable_request_id_is_echoed(server: RunningServer, given: str) -> None:
    with server.client() as client:
        assert client.get("/health/live", headers={"X-Request-ID": given}).headers["x-request-id"] == given


@pytest.mark.parametrize(
    "given", ["x" * (MAX_REQUEST_ID_LENGTH + 1), "two words", "<script>", 'a"b', "tab\tid", "ünïcode", ""]
)
def test_a_long_or_odd_request_id_is_replaced_not_echoed(server: RunningServer, given: str) -> None:
    with server.client() as client:
        response = client.get("/health/live", headers={"X-Request-ID": given.encode()})
    echoed = response.headers["x-request-id"]
    assert echoed != given and GENERATED.fullmatch(echoed)


def test_every_answer_carries_a_request_id(server: RunningServer, cifar_images: list[bytes]) -> None:
    """Success, a refusal by a route, an unknown path, and a refusal before any route is reached
    (the body limit, from the Content-Length header alone): generated ids are fresh each time."""
    with server.client() as client:
        answers = [
            client.post("/classify", content=cifar_images[0]),
            client.post("/classify", content=b"not an image"),
            client.get("/no/such/path"),
            client.post("/classify", content=b"\0" * (64 * 1024 + 1)),
            client.post("/classify", content=b"not an image", headers={"X-Request-ID": "mine-1"}),
        ]
    assert [a.status_code for a in answers] == [200, 422, 404, 413, 422]
    ids = [a.headers["x-request-id"] for a in answers]
    assert all(GENERATED.fullmatch(i) for i in ids[:4]) and len(set(ids[:4])) == 4
    assert ids[4] == "mine-1"


def test_the_v2_id_is_the_request_id_unless_the_client_sent_one(server: RunningServer) -> None:
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a [MASK]."]}]
    }
    with server.client() as client:
        given = client.post("/v2/models/tiny-mlm/infer", json=body, headers={"X-Request-ID": "v2-req"})
        own = client.post(
            "/v2/models/tiny-mlm/infer", json={**body, "id": "client-id"}, headers={"X-Request-ID": "v2-b"}
        )
    assert given.status_code == own.status_code == 200
    assert given.json()["id"] == "v2-req" == given.headers["x-request-id"]
    assert own.json()["id"] == "client-id" and own.headers["x-request-id"] == "v2-b"


def test_server_timing_on_task_answers(server: RunningServer, cifar_images: list[bytes]) -> None:
    """Each API's task answer carries the times its rows came back with from the batcher; a
    refusal that never reached a batch and a GET carry none."""
    text = {"text": "the [MASK] sat.", "top_k": 2}
    v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a [MASK] day"]}]}
    with server.client() as client:
        answers = [
            client.post("/classify", content=cifar_images[0]),
            client.post("/fill-mask", json=text),
            client.post("/models/tiny-mlm", json={"inputs": "the [MASK] sat."}),
            client.post("/v2/models/tiny-mlm-ensemble/infer", json=v2),
        ]
        refused = client.post("/classify", content=b"not an image")
        health = client.get("/health/ready")
    for answer in answers:
        assert answer.status_code == 200, answer.text
        timed = TIMING.fullmatch(answer.headers["server-timing"])
        assert timed is not None, answer.headers["server-timing"]
        queue, infer, total = (float(v) for v in timed.groups())
        assert infer > 0 and total >= queue + infer
    assert refused.status_code == 422 and "server-timing" not in refused.headers
    assert "server-timing" not in health.headers


def test_server_timing_can_be_turned_off(untimed: RunningServer, cifar_images: list[bytes]) -> None:
    with untimed.client() as client:
        response = client.post("/classify", content=cifar_images[0])
    assert response.status_code == 200 and "server-timing" not in response.headers
    assert "x-request-id" in response.headers


def test_json_logs_from_start_up_to_shutdown(
    repository: Path, tmp_path: Path, cifar_images: list[bytes]
) -> None:
    trace_id = secrets.token_hex(16)
    log_path = tmp_path / "serve.log"
    with OtlpSink() as sink:
        process = gmlp_serve(
            repository,
            log_path=log_path,
            serve_args=["--log-format", "json", "--access-log", "--grpc-port", str(free_port())],
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"},
        )
        with process:
            import httpx

            with httpx.Client(base_url=process.base_url, timeout=30) as client:
                headers = {
                    "X-Request-ID": "log-ok",
                    "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
                }
                assert client.post("/classify", content=cifar_images[0], headers=headers).status_code == 200
                refused = client.post(
                    "/classify", content=b"not an image", headers={"X-Request-ID": "log-bad"}
                )
                assert refused.status_code == 422
            assert http_get(f"{process.base_url}/metrics")
    text = log_path.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line parses
    assert all(
        isinstance(line, dict) and {"time", "level", "logger", "message"} <= set(line) for line in lines
    )
    messages = [line["message"] for line in lines]
    assert any("Application startup complete" in m for m in messages)
    assert any("Finished server process" in m for m in messages)
    (ok,) = [line for line in lines if line.get("request_id") == "log-ok"]
    assert ok["logger"] == "service.access" and ok["status"] == 200 and ok["route"] == "/classify"
    assert ok["model"] == "tiny-vision" and ok["method"] == "POST" and ok["duration_ms"] > 0
    assert ok["trace_id"] == trace_id and re.fullmatch(r"[0-9a-f]{16}", ok["span_id"])
    (bad,) = [line for line in lines if line.get("request_id") == "log-bad"]
    assert bad["status"] == 422 and bad["route"] == "/classify"
