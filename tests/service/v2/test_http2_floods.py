"""HTTP/2 floods on the gRPC port: while one client floods it, another client's ordinary calls
(a small ModelInfer, ServerLive, ModelReady) are answered, and the server still answers once the
flood is over (docs/security.md, "HTTP/2 floods").

The floods (tests/support/h2_floods.py) run in a process of their own, speaking HTTP/2 with the
`h2` library over raw sockets, and target ModelInfer: a flood's calls wait in their method's
queue, so ModelInfer is where another client would feel one. The ordinary client is grpcio's,
with a deadline on every call (a bound, not a speed requirement).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.h2_floods import Flood

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

CALL_DEADLINE_S = 10.0


@pytest.fixture
def server(start_server: Any) -> Iterator[RunningServer]:
    """A server of its own for each flood (one flood's damage is no other test's failure)."""
    from support.servers import free_port

    running = start_server(grpc_port=free_port())
    yield running
    running.stop()


def infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tiny-vision")
    request.inputs.add(name="pixel_values", datatype="FP32", shape=[1, 3, 32, 32])
    request.raw_input_contents.append(bytes(4 * 3 * 32 * 32))
    return request


def ordinary_calls(port: int, rounds: int = 3) -> list[str]:
    """The status of a small ModelInfer, ServerLive and ModelReady, `rounds` times, from a client
    of its own (one channel, opened now)."""
    codes = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = (
            lambda: stub.ModelInfer(infer_request(), timeout=CALL_DEADLINE_S),
            lambda: stub.ServerLive(pb.ServerLiveRequest(), timeout=CALL_DEADLINE_S),
            lambda: stub.ModelReady(pb.ModelReadyRequest(name="tiny-mlm"), timeout=CALL_DEADLINE_S),
        )
        for _ in range(rounds):
            for call in calls:
                try:
                    call()
                    codes.append("OK")
                except grpc.RpcError as error:
                    codes.append(error.code().name)
    return codes


def flooded(server: RunningServer, kind: str, **flood: Any) -> tuple[list[str], dict[str, Any]]:
    """The ordinary calls' statuses while `kind` floods `server`, and the flood's summary."""
    port = server.settings.grpc_port
    running = Flood.start(kind, port, **flood)
    try:
        codes = ordinary_calls(port)
        overlapped = running.running
    finally:
        summary = running.stop()
    assert overlapped, f"the flood ended before the ordinary calls did: {summary}"
    assert summary["frames_sent"] > 0, summary
    return codes, summary


def check_served(server: RunningServer, kind: str, **flood: Any) -> dict[str, Any]:
    codes, summary = flooded(server, kind, **flood)
    assert codes == ["OK"] * len(codes), summary
    assert ordinary_calls(server.settings.grpc_port, rounds=1) == ["OK"] * 3  # and afterwards
    return summary


def test_a_rapid_reset_flood_leaves_other_clients_served(server: RunningServer) -> None:
    """CVE-2023-44487: 16 connections, each opening streams and resetting them at once, thousands
    a round. The streams beyond each connection's limit are refused; the reset ones count against
    it until the server has finished with them."""
    summary = check_served(server, "rapid_reset", connections=16, per_round=3000)
    assert summary["received"].get("rst_stream", 0) > 0  # refused streams


def test_many_streams_on_a_connection_leave_other_clients_served(server: RunningServer) -> None:
    """5,000 calls kept open on each of 4 connections, waiting for their message (one opened again
    for each the server ends): those beyond each connection's stream limit are refused."""
    summary = check_served(server, "many_streams", connections=4, per_round=500)
    assert summary["streams_opened"] > summary["received"].get("rst_stream", 0) > 0


def test_calls_whose_answers_cannot_be_sent_leave_other_clients_served(server: RunningServer) -> None:
    """A client whose receive window is 0 on every stream (it reads nothing), on 4 connections:
    its whole ModelInfer calls are run, but their answers can never go out, so each call stays
    open; those beyond each connection's stream limit are refused, and another client's calls are
    answered as ever."""
    message = infer_request().SerializeToString()
    summary = check_served(server, "zero_window", connections=4, per_round=200, message=message)
    assert summary["streams_opened"] > summary["received"].get("rst_stream", 0) > 0
    assert summary["received"].get("data", 0) == 0  # no answer got through the closed window


def test_a_continuation_flood_leaves_other_clients_served(server: RunningServer) -> None:
    """A header block that never ends (HEADERS without END_HEADERS, then CONTINUATION frames) on
    4 connections: what is over the metadata limit is dropped as it arrives."""
    check_served(server, "continuation", connections=4, per_round=200)


def test_a_settings_flood_leaves_other_clients_served(server: RunningServer) -> None:
    """Thousands of SETTINGS frames on 4 connections, each of which the server must acknowledge."""
    check_served(server, "settings", connections=4, per_round=1000)


def test_a_ping_flood_leaves_other_clients_served(server: RunningServer) -> None:
    """Thousands of PINGs on 4 connections without calls: each connection is sent away (GOAWAY)
    after its third ping too soon, and the attacker's new connections change nothing."""
    summary = check_served(server, "ping", connections=4, per_round=1000)
    assert summary["received"].get("goaway", 0) > 0


def test_metadata_is_refused_over_the_header_limit_and_never_at_random_below(server: RunningServer) -> None:
    """One metadata limit, `max_header_bytes`: gRPC core's default soft limit (8 KiB) would refuse
    a random share of the calls between it and the hard one."""
    limit = server.settings.max_header_bytes

    def status(stub: pb_grpc.GRPCInferenceServiceStub, pad: int) -> str:
        metadata = (("x-pad", "a" * pad),)
        try:
            stub.ServerLive(pb.ServerLiveRequest(), metadata=metadata, timeout=CALL_DEADLINE_S)
            return "OK"
        except grpc.RpcError as error:
            return str(error.code().name)

    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        below = [status(stub, limit * 3 // 4) for _ in range(20)]  # between 8 KiB and the limit
        over = status(stub, limit + 1)
    assert below == ["OK"] * 20
    assert over == "RESOURCE_EXHAUSTED"
