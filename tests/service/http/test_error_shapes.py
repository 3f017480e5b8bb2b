"""Each API answers its refusals in its own error shape, chosen by the route a request is for: also
for refusals before any route runs (size limits), for a known path with the wrong method, and for
unknown paths below an API's prefix."""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server(max_upload_bytes=LIMIT)


def _rest_code(body: Any) -> str:
    assert set(body) == {"error"} and isinstance(body["error"], dict), body
    return str(body["error"]["code"])


def _message(body: Any) -> str:
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return str(body["error"])


def test_a_known_path_with_the_wrong_method_answers_in_its_apis_shape(server: RunningServer) -> None:
    with server.client() as client:
        listing = client.post("/models")  # the task API's GET /models
        hf = client.get("/models/tiny-vision")  # the Hugging Face API's POST /models/{name}
        v2 = client.get("/v2/models/tiny-vision/infer")
    assert listing.status_code == hf.status_code == v2.status_code == 405
    assert _rest_code(listing.json()) == "method_not_allowed"
    assert _message(hf.json()) == _message(v2.json()) == "Method Not Allowed"


def test_unknown_paths_below_an_apis_prefix_answer_in_its_shape(server: RunningServer) -> None:
    with server.client() as client:
        v2 = client.get("/v2/systemsharedmemory/status")  # a protocol extension this server does not serve
        hf = client.post("/models/tiny-vision/extra")
        elsewhere = client.get("/v2x")
    assert v2.status_code == hf.status_code == elsewhere.status_code == 404
    assert _message(v2.json()) == _message(hf.json()) == "Not Found"
    assert _rest_code(elsewhere.json()) == "not_found"


def _declared_too_large(server: RunningServer, path: str) -> tuple[int, Any]:
    """A request whose Content-Length is over the limit, refused before any route reads it."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {LIMIT + 1}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(head.encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_refusals_before_routing_answer_in_the_shape_of_the_route_they_are_for(server: RunningServer) -> None:
    for path in ("/classify", "/v2/models/tiny-vision/infer", "/models/tiny-vision"):
        status, body = _declared_too_large(server, path)
        assert status == 413, (path, body)
        if path == "/classify":
            assert _rest_code(body) == "payload_too_large"
        else:
            assert "larger than the limit" in _message(body)
