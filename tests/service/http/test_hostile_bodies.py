"""Request bodies counted as the service reads them, against a real server: a compressed body (REST
`Content-Encoding`, gRPC `grpc-encoding`) never gets past the body limit by being small on the
wire, a body of 10^5 one-byte chunks is answered, and multipart bodies of 10^4 parts or with a
10^5-byte boundary (BentoML's CVE-2024-9056) are refused at once with a 4xx. Every wait is bounded
(socket and call timeouts)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import re
import socket
import threading
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.http.parsing import TINY_PNG_BASE64

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)
LIMIT = 1 << 20
PNG = base64.b64decode(TINY_PNG_BASE64)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    from support.servers import free_port

    return start_server(max_upload_bytes=LIMIT, grpc_port=free_port())


def _exchange(server: RunningServer, request: bytes) -> tuple[int, bytes]:
    """The status and body of the answer to `request`, which a thread sends while the answer is
    read: a server that refuses early answers before it has read everything sent."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sender = threading.Thread(target=_send, args=(sock, request), daemon=True)
        sender.start()
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
    sender.join(60)
    return int(head.split(b" ", 2)[1]), body


def _send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server may close once it has answered
        sock.sendall(data)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "identity, gzip"])
@pytest.mark.parametrize(
    ("path", "content_type", "shape"),
    [
        ("/fill-mask", "application/json", "rest"),
        ("/classify", "image/png", "rest"),
        ("/v2/models/tiny-mlm/infer", "application/json", "v2"),
        ("/models/tiny-mlm", "application/json", "hf"),
    ],
)
def test_a_compressed_body_is_refused_with_415_before_it_is_read(
    server: RunningServer, encoding: str, path: str, content_type: str, shape: str
) -> None:
    """A bomb: 16 MiB of spaces after a JSON document, 16 KiB compressed, under the limit on the wire."""
    body = gzip.compress(b'{"inputs": "a [MASK] day"}' + b" " * (16 << 20))
    assert len(body) < LIMIT
    headers = {"Content-Type": content_type, "Content-Encoding": encoding}
    with server.client() as client:
        answer = client.post(path, content=body, headers=headers)
    assert answer.status_code == 415, answer.text
    error = answer.json()["error"]
    message = error["message"] if shape == "rest" else error
    assert "Content-Encoding" in message and "uncompressed" in message
    if shape == "rest":
        assert error["code"] == "unsupported_media_type"
    with server.client() as client:  # identity is no encoding at all
        plain = client.post("/classify", content=PNG, headers={"Content-Encoding": "identity"})
    assert plain.status_code == 200


def _infer_request(size: int) -> Any:
    """A v2 gRPC request for the tiny classifier with `size` bytes of zeros as its raw pixels."""
    request = service_pb2.ModelInferRequest(model_name="tiny-vision", raw_input_contents=[bytes(size)])
    request.inputs.add(name="pixel_values", datatype="FP32", shape=[size // (3 * 32 * 32 * 4), 3, 32, 32])
    return request


def _grpc_call(server: RunningServer, request: Any) -> Any:
    async def call() -> Any:
        target = f"127.0.0.1:{server.settings.grpc_port}"
        async with grpc.aio.insecure_channel(target, compression=grpc.Compression.Gzip) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return await stub.ModelInfer(request, timeout=30, compression=grpc.Compression.Gzip)

    return asyncio.run(call())


def test_a_grpc_message_is_bounded_after_decompression(server: RunningServer) -> None:
    """grpc core decompresses a gzip message within `grpc.max_receive_message_length` (the body
    limit): a message of 16 rows of zeros is 16 times the limit, a few KiB compressed."""
    row = 3 * 32 * 32 * 4
    big = _infer_request(16 * LIMIT // row * row)
    assert len(gzip.compress(big.SerializeToString())) < LIMIT // 4 < LIMIT < big.ByteSize()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _grpc_call(server, big)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    small = _grpc_call(server, _infer_request(row))  # compressed calls under the limit are served
    assert list(small.outputs[0].shape) == [1, 10]


def test_a_body_of_a_hundred_thousand_one_byte_chunks_is_answered(server: RunningServer) -> None:
    document = json.dumps({"text": "a [MASK] day", "top_k": 2}).encode()
    body = document + b" " * (100_000 - len(document))  # JSON allows trailing whitespace
    chunks = b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))) + b"0\r\n\r\n"
    head = (
        b"POST /fill-mask HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    status, answer = _exchange(server, head + chunks)
    assert status == 200 and len(json.loads(answer)["predictions"][0]) == 2
    over = b"1000\r\n" + b" " * 4096 + b"\r\n"  # and chunks are counted against the limit
    status, answer = _exchange(
        server, head + b"%x\r\n%s\r\n" % (len(document), document) + over * (LIMIT // 4096 + 1) + b"0\r\n\r\n"
    )
    assert status == 413 and json.loads(answer)["error"]["code"] == "payload_too_large"


def _multipart(boundary: bytes, parts: int) -> bytes:
    field = b'Content-Disposition: form-data; name="f%d"\r\n\r\nx\r\n'
    body = b"".join(b"--" + boundary + b"\r\n" + field % i for i in range(parts))
    return body + b"--" + boundary + b"--\r\n"


def _post_multipart(server: RunningServer, boundary: bytes, body: bytes) -> tuple[int, Any]:
    """A multipart upload to /classify; a head over the header limit is sent without its body (it
    is refused before the body is read, and a body sent after would meet a closed connection)."""
    head = (
        b"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary="
        + boundary
        + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    status, answer = _exchange(server, head + (body if len(head) < server.settings.max_header_bytes else b""))
    return status, json.loads(answer)["error"]


def test_a_multipart_body_of_ten_thousand_parts_is_refused(server: RunningServer) -> None:
    body = _multipart(b"b0undary", 10_000)
    assert len(body) < LIMIT
    status, error = _post_multipart(server, b"b0undary", body)
    assert status == 400 and "fields" in error["message"]


@pytest.mark.parametrize("length", [100_000, 10_000, 71])
def test_a_long_multipart_boundary_is_refused(server: RunningServer, length: int) -> None:
    """RFC 2046 allows 70 characters; a long one costs every search of the body for it."""
    boundary = b"b" * length
    status, error = _post_multipart(server, boundary, _multipart(boundary, 1))
    assert 400 <= status < 500, error
    if length < server.settings.max_header_bytes:
        assert status == 400 and "boundary" in error["message"]
