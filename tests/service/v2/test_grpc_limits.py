"""The gRPC server's connection limits: a connection that never completes its handshake is closed
after the header limit, and connections closed at their maximum age are re-opened by clients
without a failed call."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from service.v2.grpc_access import connection_options

pytestmark = pytest.mark.timeout(120)


def test_a_silent_connection_is_closed_after_the_handshake_limit(start_server: Any) -> None:
    from svc_harness import free_port

    server = start_server(grpc_port=free_port(), header_timeout_s=1.0)
    sock = socket.create_connection(("127.0.0.1", server.settings.grpc_port), timeout=20)
    received = b""
    while chunk := sock.recv(4096):  # the server's SETTINGS, then the close (socket.timeout fails)
        received += chunk
    sock.close()
    assert received  # it spoke HTTP/2 first, then gave up on a client that never did


def test_calls_survive_connections_closed_at_their_maximum_age(start_server: Any) -> None:
    from svc_harness import free_port

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
