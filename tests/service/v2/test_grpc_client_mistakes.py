"""A client's mistake is one log line, never a traceback: a message that is not the method's
protobuf (answered INVALID_ARGUMENT, where gRPC core logged a traceback and answered UNKNOWN),
and an abort after the client left (the status cannot be sent: the call ends as cancelled)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from grpc._cython import cygrpc

from service.telemetry.metrics import ServiceMetrics
from service.v2.grpc_server import CallHandling
from service.v2.proto import grpc_predict_v2_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def test_a_malformed_message_is_invalid_argument_and_no_traceback(start_server: Any, caplog) -> None:
    from support.servers import free_port

    server = start_server(grpc_port=free_port())
    with (
        caplog.at_level(logging.DEBUG),
        grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel,
    ):
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff\xff\xff\xff not a protobuf", timeout=30)
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        assert live(pb.ServerLiveRequest(), timeout=30).live  # the server goes on serving
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelInferRequest message" in refused.value.details()
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


class EndedCall:
    """A servicer context whose call ended before the abort: sending the status fails in core."""

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        raise cygrpc.ExecuteBatchError('Failed "execute_batch": (SendStatusFromServerOperation,)')


def test_an_abort_after_the_client_left_is_one_line_and_ends_as_cancelled(caplog) -> None:
    from contract.errors import ErrorCode, InvalidInput

    handling = CallHandling(ServiceMetrics(8), None, None)
    refusal = InvalidInput(ErrorCode.INVALID_INPUTS, "no such input")
    with (
        caplog.at_level(logging.DEBUG, logger="service.v2.grpc_server"),
        pytest.raises(asyncio.CancelledError),
    ):
        asyncio.run(handling.abort(EndedCall(), refusal, ()))  # type: ignore[arg-type]
    (line,) = [r for r in caplog.records if r.name == "service.v2.grpc_server"]
    assert line.levelno == logging.INFO and not line.exc_info
    assert "ended before its status INVALID_ARGUMENT could be sent: no such input" in line.getMessage()
