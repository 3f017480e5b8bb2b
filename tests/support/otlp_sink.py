"""An OTLP/HTTP trace receiver on 127.0.0.1: what a collector would be, for the tracing tests.

It answers `POST /v1/traces` as the OpenTelemetry protocol says (a protobuf
`ExportTraceServiceRequest`, plain or gzip-compressed, answered with an empty
`ExportTraceServiceResponse`) and keeps every span it decoded, flattened into `Span` records
(ids as hex strings, attributes as Python values), for a test to read. It needs
opentelemetry-proto (installed with the `otel` extra).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

TRACES_PATH = "/v1/traces"


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


@dataclass(frozen=True)
class Span:
    """One received span: ids in hex (parent "" for a root), times in epoch nanoseconds."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)
    events: list[str] = field(default_factory=list)
    service_name: str = ""


class OtlpSink:
    """The receiver; as a context manager it listens inside the block (`endpoint` is its URL)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding", "") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_error(404)
                    return
                sink.receive(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: a test's output is not the place for the exporter's requests

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-sink", daemon=True)

    def receive(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            status_code=s.status.code,
                            status_message=s.status.message,
                            links=[
                                (
                                    lk.trace_id.hex(),
                                    lk.span_id.hex(),
                                    {kv.key: _value(kv.value) for kv in lk.attributes},
                                )
                                for lk in s.links
                            ],
                            events=[e.name for e in s.events],
                            service_name=str(resource.get("service.name", "")),
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1

    def received(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> OtlpSink:
        self.thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["OtlpSink", "Span", "TRACES_PATH"]
