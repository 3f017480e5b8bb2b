"""The gRPC server's connection limits: a connection that never completes its handshake is closed
after the header limit, connections beyond `grpc_max_connections` are closed at once (before the
server says a word) while clients below it are served, an idle connection is sent away after
`grpc_max_connection_idle_s`, and connections closed at their maximum age are re-opened by clients
without a failed call."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from service.v2.grpc_limits import connection_options

pytestmark = pytest.mark.timeout(120)


def test_a_silent_connection_is_closed_after_the_handshake_limit(start_server: Any) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port(), header_timeout_s=1.0)
    sock = socket.create_connection(("127.0.0.1", server.settings.grpc_port), timeout=20)
    received = b""
    while chunk := sock.recv(4096):  # the server's SETTINGS, then the close (socket.timeout fails)
        received += chunk
    sock.close()
    assert received  # it spoke HTTP/2 first, then gave up on a client that never did


# An HTTP/2 client's opening: the preface and an empty SETTINGS frame.
H2_OPENING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY = 0x7


def _h2_connection(port: int) -> tuple[socket.socket, bytes]:
    """An HTTP/2 connection that opened and then stays idle, and the server's first bytes (b"" when
    it closed the connection without a word)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(H2_OPENING)
    try:
        return sock, sock.recv(4096)
    except ConnectionResetError:
        return sock, b""


def _frame_types(data: bytes) -> list[int]:
    types, offset = [], 0
    while offset + 9 <= len(data):
        types.append(data[offset + 3])
        offset += 9 + int.from_bytes(data[offset : offset + 3], "big")
    return types


def test_connections_beyond_the_cap_are_closed_at_once(start_server: Any) -> None:
    from support.servers import free_port, wait_until

    cap = 20
    server = start_server(grpc_port=free_port(), grpc_max_connections=cap)
    port = server.settings.grpc_port
    held: list[socket.socket] = []
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        for _ in range(cap - 1):
            sock, first = _h2_connection(port)
            held.append(sock)
            assert first, "below the cap the server speaks HTTP/2"
        assert client.is_server_live()  # the last slot
        for _ in range(cap):  # at the cap: each newcomer closed before the server's SETTINGS
            sock, first = _h2_connection(port)
            sock.close()
            assert first == b""
        assert client.is_server_live()  # the admitted client keeps its connection
        held.pop().close()

        def admitted() -> bool:
            sock, first = _h2_connection(port)
            sock.close()
            return first != b""

        wait_until(admitted)  # a slot freed is a slot taken again
    finally:
        client.close()
        for sock in held:
            sock.close()


def test_an_idle_connection_is_sent_away_after_the_idle_limit(start_server: Any) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port(), grpc_max_connection_idle_s=1.0)
    sock, received = _h2_connection(server.settings.grpc_port)
    while chunk := sock.recv(4096):  # until the close; socket.timeout fails
        received += chunk
    sock.close()
    assert GOAWAY in _frame_types(received)


def test_calls_survive_connections_closed_at_their_maximum_age(start_server: Any) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port(), grpc_max_connection_age_s=0.5, drain_timeout_s=0.5)
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")
    try:
        answers = []
        for _ in range(30):  # spread over several connection ages
            answers.append(client.is_model_ready("tiny-mlm"))
            time.sleep(0.1)
    finally:
        client.close()
    assert all(answers) and len(answers) == 30


def test_the_options_follow_the_settings(make_settings: Any) -> None:
    options = dict(connection_options(make_settings(header_timeout_s=2.5, grpc_max_connection_idle_s=7)))
    assert options["grpc.server_handshake_timeout_ms"] == 2500
    assert options["grpc.max_connection_idle_ms"] == 7000
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert (
        dict(connection_options(make_settings(grpc_max_connections=9)))[
            "grpc.max_allowed_incoming_connections"
        ]
        == 9
    )
