"""Slow clients cannot hold connections: headers trickled a line at a time, a body shorter than its
Content-Length, a connection that sends nothing, an idle keep-alive connection. Each is answered
408 (or, having sent nothing, just closed) and closed, on both of uvicorn's HTTP protocols, while
normal requests keep being answered; a burst of them up to the connection cap stops nobody once
the header limit has passed. Every wait is bounded; no test measures time."""

from __future__ import annotations

import json
import select
import socket
from typing import TYPE_CHECKING, Any

import pytest

from service.http.connections import PROTOCOLS, http_protocol

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module", params=sorted(PROTOCOLS))
def server(start_server: Any, request: pytest.FixtureRequest) -> RunningServer:
    return start_server(
        http=http_protocol(HEADER_TIMEOUT_S, request.param),
        header_timeout_s=HEADER_TIMEOUT_S,
        request_timeout_s=2.0,
        keep_alive_timeout_s=0.5,
        max_connections=8,
    )


def _connect(server: RunningServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    sock.settimeout(20)
    return sock


def _answer_and_close(sock: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body of the one answer, read until the server closes the connection
    (socket.timeout, failing the test, if it keeps it open)."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
    return int(lines[0].split(b" ")[1]), headers, body


def _normal_request_answered(server: RunningServer) -> bool:
    with server.client(timeout=20) as client:
        return client.post("/fill-mask", json={"text": "a [MASK] day"}).status_code == 200


def test_headers_one_line_at_a_time_get_408_and_are_closed(server: RunningServer) -> None:
    sock = _connect(server)
    sock.sendall(b"POST /fill-mask HTTP/1.1\r\n")
    sent = 0
    for sent in range(1, 200):  # far more lines than the limit allows
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            break
        sock.sendall(f"X-Trickle-{sent}: a\r\n".encode())
    status, headers, body = _answer_and_close(sock)
    sock.close()
    assert sent < 199, "the server waited for every header line"
    assert status == 408 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert _normal_request_answered(server)


def test_a_body_shorter_than_its_length_gets_408_not_504(server: RunningServer) -> None:
    sock = _connect(server)
    sock.sendall(
        b"POST /fill-mask HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"text": '
    )
    assert _normal_request_answered(server)  # meanwhile
    status, headers, body = _answer_and_close(sock)
    sock.close()
    assert status == 408 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_connection_that_sends_nothing_is_closed(server: RunningServer) -> None:
    sock = _connect(server)
    assert sock.recv(1) == b""  # closed by the server, without an answer nobody asked for
    sock.close()


def test_an_idle_keep_alive_connection_is_closed(server: RunningServer) -> None:
    sock = _connect(server)
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, _, body = _answer_and_close(sock)  # answered, then closed once idle
    sock.close()
    assert status == 200 and json.loads(body)["status"] == "alive"


def test_a_burst_of_slow_clients_up_to_the_cap_stops_nobody_after_the_limit(server: RunningServer) -> None:
    before = server.metric("gmlp_refusals_total", transport="http", code="request_timeout")
    slow = [_connect(server) for _ in range(server.settings.max_connections)]
    for sock in slow:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n")  # never the blank line
    answers = [_answer_and_close(sock) for sock in slow]
    for sock in slow:
        sock.close()
    assert all(status == 408 for status, _, _ in answers)
    server.wait_for(lambda: _normal_request_answered(server))
    after = server.metric("gmlp_refusals_total", transport="http", code="request_timeout")
    assert after - before >= len(slow)
