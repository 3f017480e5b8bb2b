"""Hostile clients against a real server: slow bodies, idle connections, oversized headers,
pipelining and malicious payloads. Each gets a clear 4xx (or 503 when shedding), never a 5xx or
a hang, and the server keeps serving everyone else. Every wait is bounded."""

from __future__ import annotations

import base64
import json
import socket
import time
from typing import TYPE_CHECKING, Any

import pytest

from service.http.connections import PROTOCOLS

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(request_timeout_s=2.0, max_connections=12)


def _connect(server: RunningServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    sock.settimeout(20)
    return sock


class Responses:
    """Reads HTTP responses one after another from a socket, keeping what arrived past each one
    (pipelined answers may come in one packet)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def next(self) -> bytes:
        """One whole response (headers and Content-Length body), or what came before EOF."""
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                response, self.buffer = self.buffer, b""
                return response
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(rest) < length and self._fill():
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
        self.buffer = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]


def _read_response(sock: socket.socket) -> bytes:
    return Responses(sock).next()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_a_slow_body_gets_408_at_the_deadline_and_holds_up_nobody(server: RunningServer) -> None:
    slow = _connect(server)
    body = json.dumps({"text": "a [MASK] day"}).encode()
    slow.sendall(
        b"POST /fill-mask HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:3]
    )
    with server.client() as client:  # everyone else is served meanwhile
        assert client.post("/fill-mask", json={"text": "a [MASK] day"}).status_code == 200
    for byte in body[3:8]:  # a few bytes a second, never the whole body
        slow.sendall(bytes([byte]))
        time.sleep(0.3)
    response = _read_response(slow)
    closed = slow.recv(1) == b""  # closed at once after the answer
    slow.close()
    # The client's slowness, not the server's: 408 (not 504), and the connection is not kept.
    assert _status(response) == 408 and b'"request_timeout"' in response
    assert b"connection: close" in response.lower() and closed
    assert server.metric("gmlp_refusals_total", transport="rest", code="request_timeout") >= 1


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_idle_connections_are_capped_with_503_and_released(start_server: Any, protocol: str) -> None:
    server = start_server(http=PROTOCOLS[protocol], max_connections=2)
    idle = [_connect(server) for _ in range(2)]  # the cap, each sending nothing
    try:
        with server.client() as client:
            server.wait_for(lambda: client.get("/health/live").status_code == 503)
        sock = _connect(server)
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head, _, body = _read_response(sock).partition(b"\r\n\r\n")
        closed = sock.recv(1) == b""  # the refused connection is released at once
        sock.close()
    finally:
        for sock in idle:
            sock.close()
    headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert _status(head) == 503 and headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
    assert closed and json.loads(body)["error"]["code"] == "too_many_connections"
    with server.client() as client:
        server.wait_for(lambda: client.get("/health/ready").status_code == 200)
        assert client.post("/fill-mask", json={"text": "a [MASK] day"}).status_code == 200
    assert server.metric("gmlp_refusals_total", transport="http", code="too_many_connections") >= 2


def test_oversized_headers_get_431(server: RunningServer) -> None:
    with server.client() as client:
        response = client.get("/health/live", headers={"x-padding": "a" * 20_000})
    assert response.status_code == 431 and response.json()["error"]["code"] == "headers_too_large"


def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    sock = _connect(server)
    sock.sendall(
        b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n"
        b"GET /nowhere HTTP/1.1\r\nHost: localhost\r\n\r\n"
        b"GET /health/ready HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    responses = Responses(sock)
    statuses = [_status(responses.next()) for _ in range(3)]
    sock.close()
    assert statuses == [200, 404, 200]


LIMIT = 8 * 1024 * 1024
HOSTILE = [
    ("json nested 100000 deep", "/fill-mask", {"content": b"[" * 100_000 + b"]" * 100_000}, 422),
    (
        "10 MB of base64",
        "/classify",
        {"json": {"image": base64.b64encode(b"\0" * (LIMIT + 1)).decode()}},
        413,
    ),
    ("100000 targets", "/fill-mask", {"json": {"text": "a [MASK]", "targets": ["x"] * 100_000}}, 422),
    ("every token a [MASK]", "/fill-mask", {"json": {"text": "[MASK] " * 30}}, 422),
    ("non-UTF-8 bytes", "/fill-mask", {"content": b'{"text": "\xff\xfe [MASK]"}'}, 422),
    ("raw NUL in JSON", "/fill-mask", {"content": b'{"text": "a\x00 [MASK]"}'}, 422),
    ("huge top_k", "/fill-mask", {"json": {"text": "a [MASK]", "top_k": 10**30}}, 422),
    (
        "negative top_k",
        "/classify?top_k=-1",
        {"content": b"x", "headers": {"content-type": "image/png"}},
        422,
    ),
    ("float top_k", "/classify?top_k=1.5", {"content": b"x", "headers": {"content-type": "image/png"}}, 422),
    (
        "v2 shape overflow",
        "/v2/models/tiny-vision/infer",
        {
            "json": {
                "inputs": [{"name": "pixel_values", "shape": [2**40, 2**40], "datatype": "FP32", "data": [0]}]
            }
        },
        400,
    ),
    (
        "hf nested",
        "/models/tiny-mlm",
        {"content": b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"},
        422,
    ),
]


@pytest.mark.parametrize(("path", "kwargs", "status"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_malicious_payloads_get_a_clear_4xx(
    server: RunningServer, path: str, kwargs: dict[str, Any], status: int
) -> None:
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})} if "content" in kwargs else {}
    with server.client() as client:
        response = client.post(path, headers=headers, **kwargs)
        assert client.get("/health/ready").status_code == 200  # and the server is still fine
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert len(message) > 10


def test_nul_characters_in_text_are_just_text(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/fill-mask", json={"text": "a\u0000b [MASK] \u0000"})
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1


PATHOLOGICAL_TEXTS = {
    "a 100k-character word": "a" * 100_000 + " [MASK].",
    "a million combining marks": "e" + "\u0301" * 1_000_000 + " [MASK].",
    "fullwidth [MASK] look-alikes only": "the \uff3b\uff2d\uff21\uff33\uff2b\uff3d sat.",
    "fullwidth look-alikes beside a mask": "\uff3b\uff2d\uff21\uff33\uff2b\uff3d " * 1000 + "the [MASK] sat.",
    "control characters": "\x1b[31m\x07\x08 the [MASK] \x7f\x85 sat \x1b]0;x\x07.",
    "a word of 50k mask look-alikes": "\uff3bMASK\uff3d" * 50_000 + " [MASK]",
}


@pytest.mark.parametrize("text", PATHOLOGICAL_TEXTS.values(), ids=PATHOLOGICAL_TEXTS)
def test_pathological_texts_cost_a_bounded_time(server: RunningServer, text: str) -> None:
    """Texts built to make a tokenizer or a regex work without bound are answered (or refused with
    a 4xx that says why) within the request's deadline, and the server stays ready."""
    with server.client() as client:
        response = client.post(
            "/fill-mask", json={"text": text}, timeout=server.settings.request_timeout_s + 5
        )
        assert client.get("/health/ready").status_code == 200
    assert response.status_code in (200, 413, 422), response.text[:300]
    if response.status_code != 200:
        assert len(response.json()["error"]["message"]) > 10
