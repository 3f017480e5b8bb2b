"""OpenTelemetry tracing against a real OTLP/HTTP receiver (support.otlp_sink), over real servers.

The server exports with the SDK's own OTLP exporter, configured by the standard variables only;
the receiver decodes the protobufs of opentelemetry-proto. What is checked is what a trace viewer
would show: parentage from an incoming `traceparent` (REST and gRPC), the request's child spans,
one batch span linked to every request it served, error spans with their code, and nothing at
all (not even an exporter thread) when the variables leave tracing off.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from service.telemetry.tracing import configured
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.otlp_sink import OtlpSink, Span
from support.servers import RunningServer, free_port, wait_until

pytestmark = pytest.mark.timeout(180)

SERVER_KIND = 2  # SPAN_KIND_SERVER
STATUS_ERROR = 2


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpSink]:
    """A receiver, and the standard variables that point the next server started at it."""
    with OtlpSink() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/v1/traces")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gmlp-under-test")
        yield receiver


@pytest.fixture
def traced(sink: OtlpSink, start_server: Callable[..., RunningServer]) -> Iterator[RunningServer]:
    """A traced server: one instance, and a batching window long enough that eight concurrent
    requests always meet in one batch."""
    server = start_server(
        instances=1,
        max_batch_size=8,
        queue_delay_policy="always",
        max_queue_delay_ms=5000,
        grpc_port=free_port(),
    )
    yield server
    server.stop()


def traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent}-01", trace_id, parent


def spans_of(sink: OtlpSink, trace_id: str, count: int) -> list[Span]:
    """The spans of one trace, once `count` of them have arrived."""
    wait_until(lambda: len([s for s in sink.received() if s.trace_id == trace_id]) >= count, timeout=30)
    return [s for s in sink.received() if s.trace_id == trace_id]


def test_a_traceparent_is_continued_with_the_request_steps_as_children(
    traced: RunningServer, sink: OtlpSink, cifar_images: list[bytes]
) -> None:
    header, trace_id, parent = traceparent()
    with traced.client() as client:
        response = client.post("/classify", content=cifar_images[0], headers={"traceparent": header})
    assert response.status_code == 200
    spans = spans_of(sink, trace_id, 6)
    (server,) = [s for s in spans if s.kind == SERVER_KIND]
    assert server.parent_span_id == parent and server.name == "POST /classify"
    assert server.attributes["http.route"] == "/classify"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gmlp.request_id"] == response.headers["x-request-id"]
    assert server.service_name == "gmlp-under-test"
    children = {s.name: s for s in spans if s.parent_span_id == server.span_id}
    assert {"read body", "preprocess", "queue wait", "postprocess", "batch tiny-vision"} <= set(children)
    batch = children["batch tiny-vision"]
    assert batch.attributes["gmlp.batch.size"] == 1 and batch.attributes["gmlp.batch.instance"] == 0
    assert batch.attributes["gmlp.model.variant"] in ("fp32", "int8")
    assert [(t, s) for t, s, _ in batch.links] == [(trace_id, server.span_id)]
    # The request's steps lie inside its span, and the batch after its queue wait.
    for child in children.values():
        assert server.start_ns <= child.start_ns <= child.end_ns <= server.end_ns
    assert children["queue wait"].end_ns <= batch.start_ns


def test_eight_concurrent_requests_give_one_batch_span_linked_to_each(
    traced: RunningServer, sink: OtlpSink
) -> None:
    texts = [f"the [MASK] number {i}." for i in range(8)]
    headers = [traceparent() for _ in texts]

    def send(i: int) -> int:
        with traced.client() as client:
            body = {"text": texts[i]}
            return client.post("/fill-mask", json=body, headers={"traceparent": headers[i][0]}).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, range(8))) == [200] * 8
    servers = {}
    for _, trace_id, _ in headers:
        (server,) = [s for s in spans_of(sink, trace_id, 5) if s.kind == SERVER_KIND]
        servers[trace_id] = server.span_id
    wait_until(lambda: any(s.name == "batch tiny-mlm" for s in sink.received()), timeout=30)
    batches = [s for s in sink.received() if s.name == "batch tiny-mlm"]
    assert len(batches) == 1
    (batch,) = batches
    assert batch.attributes["gmlp.batch.size"] == 8
    assert batch.attributes["gmlp.batch.padded_length"] % 8 == 0
    assert {(t, s) for t, s, _ in batch.links} == set(servers.items())
    # A child of the first request it served, so that it is sampled with it.
    assert (batch.trace_id, batch.parent_span_id) in servers.items()


def test_an_error_gives_an_error_span_with_its_code(traced: RunningServer, sink: OtlpSink) -> None:
    header, trace_id, _ = traceparent()
    with traced.client() as client:
        response = client.post("/classify", content=b"not an image", headers={"traceparent": header})
    assert response.status_code == 422
    code = response.json()["error"]["code"]
    (server,) = [s for s in spans_of(sink, trace_id, 1) if s.kind == SERVER_KIND]
    assert server.status_code == STATUS_ERROR and server.attributes["error.type"] == code
    assert code in server.status_message and server.attributes["http.response.status_code"] == 422


def test_grpc_continues_the_traceparent_and_returns_the_request_id(
    traced: RunningServer, sink: OtlpSink
) -> None:
    header, trace_id, parent = traceparent()
    with grpc.insecure_channel(f"127.0.0.1:{traced.settings.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply, call = stub.ModelMetadata.with_call(
            pb.ModelMetadataRequest(name="tiny-vision"),
            metadata=[("traceparent", header), ("x-request-id", "grpc-call-1")],
        )
        assert reply.name == "tiny-vision"
        assert ("x-request-id", "grpc-call-1") in tuple(call.trailing_metadata())
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(
                pb.ModelMetadataRequest(name="no-such-model"), metadata=[("traceparent", header)]
            )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert any(key == "x-request-id" for key, _ in refused.value.trailing_metadata())
    spans = [s for s in spans_of(sink, trace_id, 2) if s.kind == SERVER_KIND]
    assert {s.parent_span_id for s in spans} == {parent}
    ok, failed = sorted(spans, key=lambda s: s.status_code)
    assert (
        ok.attributes["rpc.method"] == "ModelMetadata" and ok.attributes["gmlp.request_id"] == "grpc-call-1"
    )
    assert failed.status_code == STATUS_ERROR and failed.attributes["error.type"] == "model_not_found"


def _exporter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("OtelBatch")]


def test_tracing_off_exports_nothing_and_starts_no_exporter_thread(
    sink: OtlpSink,
    monkeypatch: pytest.MonkeyPatch,
    start_server: Callable[..., Any],
    cifar_images: list[bytes],
) -> None:
    # An endpoint alone would switch tracing on; OTEL_TRACES_EXPORTER=none keeps it off.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    server = start_server()
    try:
        assert server.app.state.tracing is None and _exporter_threads() == []
        with server.client() as client:
            response = client.post(
                "/classify", content=cifar_images[0], headers={"traceparent": traceparent()[0]}
            )
        assert response.status_code == 200
        assert _exporter_threads() == []
    finally:
        server.stop()
    assert sink.received() == [] and sink.requests == 0


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_the_standard_variables_switch_tracing(environ: dict[str, str], on: bool) -> None:
    assert configured(environ) is on
