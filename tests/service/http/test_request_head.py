"""The request head and what a request can make the server write, against a real server (REST and
gRPC): the query string counts in the head's size, HTTP/1.1 needs exactly one Host header, a
client's value never forges a log line, and no echoed value makes an error long."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.errors import ErrorCode, ModelNotFound
from contract.messages import CONTROL_CHARACTERS, ECHO_LIMIT, MESSAGE_LIMIT, echo
from service.telemetry.logs import TextFormatter
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.raw_http import raw_request

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)
HUGE = "m" * (1 << 20)  # a 1 MiB model name


@pytest.fixture(scope="module")
def server(start_server: Any, grpc_port: Any) -> RunningServer:
    return start_server(grpc_port=grpc_port(), access_log=True, max_header_bytes=4096)


@pytest.fixture(scope="module")
def grpc_port() -> Any:
    from support.servers import free_port

    return free_port


def test_the_query_string_counts_in_the_head_limit(server: RunningServer) -> None:
    limit = server.settings.max_header_bytes
    status, body = raw_request(server.port, "GET", "/health/live?pad=" + "a" * limit)
    assert status == 431 and json.loads(body)["error"]["code"] == "headers_too_large"
    assert raw_request(server.port, "GET", "/health/live?pad=" + "a" * (limit // 2))[0] == 200


@pytest.mark.parametrize("hosts", [0, 2])
def test_http_1_1_needs_exactly_one_host(server: RunningServer, hosts: int) -> None:
    headers = [("Host", "127.0.0.1")] * hosts
    status, body = raw_request(server.port, "GET", "/health/live", headers, host=False)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "bad_request" and "Host" in error["message"]
    # The v2 paths answer in the protocol's shape.
    status, body = raw_request(server.port, "GET", "/v2/health/live", headers, host=False)
    assert status == 400 and "Host" in json.loads(body)["error"]


def test_http_1_0_needs_no_host(server: RunningServer) -> None:
    assert raw_request(server.port, "GET", "/health/live", version="HTTP/1.0", host=False)[0] == 200


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """What the service's loggers write in the text format while the test runs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    root, access = logging.getLogger(), logging.getLogger("service.access")
    level = access.level
    root.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        access.setLevel(level)


FORGED = "x\n2026-12-02 00:00:00,000 CRITICAL service: forged\r\u2028\x85"


def test_a_name_with_line_breaks_writes_one_escaped_log_line(
    server: RunningServer, text_log: io.StringIO
) -> None:
    target = "/v2/models/" + "x%0A2026-12-02%2000:00:00,000%20CRITICAL%20service:%20forged%0D%E2%80%A8/ready"
    status, _ = raw_request(server.port, "GET", target)
    assert status == 404
    server.wait_for(lambda: "forged" in text_log.getvalue())
    lines = [line for line in text_log.getvalue().splitlines() if "forged" in line]
    assert len(lines) == 1 and "CRITICAL" not in lines[0].split(" ")[2]
    assert "x\\n2026-12-02 00:00:00,000 CRITICAL service: forged\\r\\u2028" in lines[0]
    assert not CONTROL_CHARACTERS.search(text_log.getvalue().replace("\n", ""))


def test_a_huge_model_name_gets_a_short_not_found(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/fill-mask", json={"model": HUGE + "\n", "text": "a [MASK]"})
    message = response.json()["error"]["message"]
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert len(message) <= MESSAGE_LIMIT + 40 and f"({len(HUGE) + 1} characters)" in message
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(pb.ModelMetadataRequest(name=HUGE), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(caught.value.details()) <= MESSAGE_LIMIT + 40 and "characters)" in caught.value.details()


def test_a_huge_unknown_field_is_not_echoed(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post(
            "/fill-mask", json={"text": "a [MASK]", HUGE: 1, **{f"k{i}": i for i in range(500)}}
        )
    body = response.json()["error"]
    assert response.status_code == 422 and len(response.content) < 20 * (ECHO_LIMIT + 200)
    assert len(body["details"]) <= 20


@given(st.text(max_size=3 * ECHO_LIMIT))
def test_echo_is_one_short_line_that_starts_as_the_value(value: str) -> None:
    shown = echo(value)
    assert not CONTROL_CHARACTERS.search(shown) and len(shown) <= 10 * ECHO_LIMIT + 60
    kept = value[:ECHO_LIMIT]
    assert shown.startswith(repr(kept)) and (len(value) > ECHO_LIMIT) == shown.endswith(" characters)")


@given(st.text(max_size=2 * MESSAGE_LIMIT))
def test_every_message_is_one_bounded_line(text: str) -> None:
    message = ModelNotFound(ErrorCode.MODEL_NOT_FOUND, text).message
    assert not CONTROL_CHARACTERS.search(message) and len(message) <= MESSAGE_LIMIT + 40
