"""Every HTTP connection counted against `max_connections` from accept: TLS connections that never
finish their handshake are counted and closed after `header_timeout_s` (the surplus at once), and
at the cap the oldest idle keep-alive connection is closed to make room for a newcomer, on both of
uvicorn's HTTP protocols and under TLS. Real servers and sockets; every wait bounded."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from service.http.connections import PROTOCOLS, http_protocol
from support.certs import Issued, TestCA
from support.servers import free_port, wait_until

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

CAP = 20
HEADER_TIMEOUT_S = 2.0
IDLE_EVICTED = {"transport": "http", "reason": "idle_evicted"}


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def server_cert(test_ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return test_ca.issue("server", tmp_path_factory.mktemp("server-tls"))


@pytest.fixture(scope="module")
def verifying(test_ca: TestCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(test_ca.pem))


@pytest.fixture(scope="module")
def tls_server(start_server: Any, server_cert: Issued, verifying: ssl.SSLContext) -> RunningServer:
    return start_server(
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        grpc_port=free_port(),
        max_connections=CAP,
        header_timeout_s=HEADER_TIMEOUT_S,
        keep_alive_timeout_s=60.0,
        client_options={"verify": verifying},
    )


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.settimeout(20)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (end of stream or reset), without waiting; what an idle
    connection may read (nothing, or a TLS record with no data) is consumed."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:  # reset, or a TLS connection cut short
        return True
    finally:
        sock.settimeout(20)


def _closing_order(socks: list[socket.socket], timeout: float = 30.0) -> list[int]:
    """For each socket, the round of a bounded poll in which the server was first seen closing it."""
    order: list[int | None] = [None] * len(socks)
    rounds = 0

    def all_closed() -> bool:
        nonlocal rounds
        rounds += 1
        for i, sock in enumerate(socks):
            if order[i] is None and _closed(sock):
                order[i] = rounds
        return all(o is not None for o in order)

    wait_until(all_closed, timeout=timeout)
    return [o for o in order if o is not None]


def _request(sock: socket.socket) -> int:
    """One keep-alive GET /health/live on `sock`, read to the end of its body: the status."""
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1])


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    """Sockets a test holds open; all closed at its end."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def test_tls_connections_that_never_handshake_are_counted_and_closed(
    tls_server: RunningServer, held: list[socket.socket]
) -> None:
    refused = {"transport": "http", "code": "too_many_connections"}
    late = {"transport": "http", "code": "request_timeout"}
    before = {
        name: tls_server.metric("gmlp_refusals_total", **labels)
        for name, labels in (("cap", refused), ("late", late))
    }
    for i in range(3 * CAP):  # silent, or stopping inside the first TLS record
        sock = _connect(tls_server.port)
        if i % 2:
            sock.sendall(b"\x16\x03\x01\x02")
        held.append(sock)
    order = _closing_order(held)  # none held past the handshake limit
    counted, surplus = order[:CAP], order[CAP:]
    assert max(surplus) < min(counted), "the surplus must be closed at once, the counted at the limit"
    with tls_server.client() as client:
        assert client.get("/health/live").status_code == 200
    assert tls_server.metric("gmlp_refusals_total", **refused) - before["cap"] >= 2 * CAP
    assert tls_server.metric("gmlp_refusals_total", **late) - before["late"] >= CAP


def _hold_idle(
    port: int, count: int, held: list[socket.socket], wrap: Callable[[socket.socket], socket.socket]
) -> None:
    """`count` connections that each made one request and stay open, idle, oldest first."""
    for _ in range(count):
        sock = wrap(_connect(port))
        held.append(sock)
        assert _request(sock) == 200


def _newcomers_served_by_evicting_the_oldest(
    server: RunningServer, held: list[socket.socket], wrap: Callable[[socket.socket], socket.socket]
) -> None:
    """With the cap held by idle keep-alive connections, fresh clients (which keep their own
    connection open in turn) are answered, each by closing the oldest idle connection, while the
    younger ones stay open."""
    before = server.metric("gmlp_connections_closed_total", **IDLE_EVICTED)
    _hold_idle(server.port, server.settings.max_connections, held, wrap)
    with contextlib.ExitStack() as clients:
        for n in range(1, 4):
            client = clients.enter_context(server.client(timeout=20))
            assert client.get("/health/live").status_code == 200
            wait_until(lambda n=n: all(_closed(sock) for sock in held[:n]))
            assert not any(_closed(sock) for sock in held[n:])
    assert server.metric("gmlp_connections_closed_total", **IDLE_EVICTED) - before >= 3


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_idle_keep_alive_connections_make_room_for_newcomers(
    start_server: Any, protocol: str, held: list[socket.socket]
) -> None:
    server = start_server(
        http=http_protocol(HEADER_TIMEOUT_S, protocol), max_connections=CAP, keep_alive_timeout_s=60.0
    )
    _newcomers_served_by_evicting_the_oldest(server, held, lambda sock: sock)


def test_idle_tls_connections_make_room_for_newcomers(
    tls_server: RunningServer, verifying: ssl.SSLContext, held: list[socket.socket]
) -> None:
    def wrap(sock: socket.socket) -> socket.socket:
        return verifying.wrap_socket(sock, server_hostname="localhost")

    _newcomers_served_by_evicting_the_oldest(tls_server, held, wrap)


def test_a_connection_in_a_request_is_never_evicted(start_server: Any, held: list[socket.socket]) -> None:
    """At the cap with no idle connection (each has started a request), the newcomer gets the 503."""
    server = start_server(max_connections=4, header_timeout_s=30.0, keep_alive_timeout_s=60.0)
    for _ in range(4):
        sock = _connect(server.port)
        assert _request(sock) == 200
        sock.sendall(b"GET /health/live HTTP/1.1\r\n")  # a second request, its headers unfinished
        held.append(sock)
    with server.client(timeout=20) as client:
        answer = client.get("/health/live")
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "too_many_connections"
    assert answer.headers["retry-after"] == "1"
    assert not any(_closed(sock) for sock in held)


def test_a_silent_tls_grpc_connection_is_closed_after_the_handshake_limit(tls_server: RunningServer) -> None:
    sock = _connect(tls_server.settings.grpc_port)
    while sock.recv(4096):  # nothing (TLS: the client speaks first), then the close; timeout fails
        pass
    sock.close()
