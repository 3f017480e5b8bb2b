"""An answer the client does not read is dropped after `send_timeout_s`, and counted.

Real sockets against a real uvicorn server: the client asks for a big answer (the raw logits of
16 texts of 16 [MASK]s, 31 MB as binary tensor data) with a small receive buffer and never reads.
The server's transport buffer stops draining; after the send timeout the connection is aborted
(its buffered answer freed), logged and counted. A client that reads gets its whole answer.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

TEXTS, MASKS, VOCAB = 16, 16, 30522
ANSWER_BYTES = TEXTS * MASKS * VOCAB * 4  # the raw FP32 logits alone


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(send_timeout_s=1.0, max_batch_size=TEXTS)


def ask_for_a_big_answer(server: RunningServer) -> socket.socket:
    """A connection with a small receive buffer that has sent a request for a 31 MB answer."""
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [TEXTS, 1],
                    "data": [" ".join(["[MASK]"] * MASKS)] * TEXTS,
                }
            ],
            "outputs": [{"name": "logits"}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    head = (
        "POST /v2/models/tiny-mlm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def read_all(sock: socket.socket) -> tuple[int, bool]:
    """Bytes received until the connection ends, and whether it ended by a reset (abort)."""
    received = 0
    try:
        while chunk := sock.recv(1 << 16):
            received += len(chunk)
            if received > ANSWER_BYTES + 4096:  # the whole answer and its head: nothing ended it
                return received, False
    except ConnectionResetError:
        return received, True
    return received, False


def dropped(server: RunningServer) -> float:
    return server.metric("gmlp_refusals_total", transport="http", code="send_timeout")


def test_an_unread_answer_is_dropped_after_the_send_timeout(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    before = dropped(server)
    with caplog.at_level(logging.WARNING, logger="service.http.connections"):
        sock = ask_for_a_big_answer(server)
        try:
            server.wait_for(lambda: dropped(server) > before, timeout=60)  # never reading meanwhile
            received, reset = read_all(sock)
        finally:
            sock.close()
    assert reset or received < ANSWER_BYTES, "the connection outlived the send timeout"
    assert received < ANSWER_BYTES
    assert dropped(server) == before + 1
    assert any("did not read" in r.getMessage() for r in caplog.records), caplog.text
    with server.client() as client:  # the server is well and serves the next client
        assert client.get("/health/live").status_code == 200


def test_a_client_that_reads_gets_its_whole_answer(server: RunningServer) -> None:
    before = dropped(server)
    sock = ask_for_a_big_answer(server)
    try:
        received = 0
        while received < ANSWER_BYTES and (chunk := sock.recv(1 << 16)):
            received += len(chunk)
    finally:
        sock.close()
    assert received >= ANSWER_BYTES and dropped(server) == before
