"""OpenTelemetry tracing: a server span per request, child spans for its steps, a span per batch.

When it is on, the variables it reads and the spans it records: docs/service.md, "Tracing
(OpenTelemetry)"; `configured` is the rule. Off, the SDK is never imported and no exporter thread
runs, and the request path never enters this module: a pipeline decides at build whether its steps
are spanned and its batches observed (`service.tasks.pipeline`), the transports whether their
requests get a server span. On, the SDK reads the standard variables itself (resource, sampler,
exporter, batch span processor); spans go out over OTLP/HTTP with protobuf bodies (the `otel`
extra), and incoming W3C trace context is continued through the propagators `OTEL_PROPAGATORS` names.

One model batch serves many requests, each in a trace of its own. The batch's span is a child of
the first sampled request it served and links to the server span of every sampled request in it,
so a trace viewer leads from any request to the batch and from the batch to all its requests.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeGuard

from service.engine import request_context
from service.engine.batcher import BatchObserver
from service.engine.request_context import BatchRun

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "gmlp-serve"
NO_SPAN: AbstractContextManager[Any] = nullcontext()  # the shared no-op of an unsampled step


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* variables ask for traces to be exported: `OTEL_TRACES_EXPORTER` other than
    none, or with it unset an OTLP endpoint; never with `OTEL_SDK_DISABLED=true`."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """One app's tracer provider (not installed globally: several apps in one process keep theirs)
    with the batch span processor and the OTLP/HTTP exporter."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
        if exporter != "otlp":
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported; exporting over OTLP/HTTP", exporter)
        protocol = os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        )
        if protocol.strip().lower() != "http/protobuf":
            log.warning("OTLP protocol %s is not supported; exporting over http/protobuf", protocol)
        resource = Resource.create(
            {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
        )
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("gmlp-serve")
        self._trace, self._context, self._propagate = trace, context, propagate

    @classmethod
    def from_environment(cls) -> Tracing | None:
        """A `Tracing` when `configured()`, else None; None with a warning if the SDK is missing."""
        if not configured():
            return None
        try:
            return cls()
        except ImportError as exc:
            log.warning(
                "tracing is configured but OpenTelemetry is not installed (%s): pip install "
                "'gmlp-serve[otel]'; serving without traces",
                exc,
            )
            return None

    def start_server_span(
        self,
        request: request_context.RequestContext,
        name: str,
        carrier: Mapping[str, str],
        attributes: dict[str, Any],
    ) -> object:
        """Open the request's SERVER span, continuing the W3C trace context in `carrier` (lower-case
        header names), as the current span of this task (what child spans take as parent); returns
        the token `end_server_span` takes."""
        parent = self._propagate.extract(carrier)
        kind = self._trace.SpanKind.SERVER
        request.span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        request.tracer = self
        return self._context.attach(self._trace.set_span_in_context(request.span))

    def end_server_span(
        self,
        request: request_context.RequestContext,
        token: object,
        status: str,
        attributes: dict[str, Any],
        *,
        failed: bool,
    ) -> None:
        """End the request's span and leave it; a refusal (or a `failed` status without one: a bug,
        an answer of the framework's own) marks it as an error with the machine code (else the
        status)."""
        trace = self._trace
        span = request.span
        span.set_attributes(attributes)
        if request.model:
            span.set_attribute("gmlp.model", request.model)
        if request.error_code is not None or failed:
            code = request.error_code or status
            span.set_attribute("error.type", code)
            span.set_status(
                trace.Status(trace.StatusCode.ERROR, f"{status} {code}: {request.error_message or ''}")
            )
        span.end()
        self._context.detach(token)  # type: ignore[arg-type]

    def span_between(
        self,
        name: str,
        parent: Any,
        start_ns: int,
        end_ns: int,
        *,
        attributes: dict[str, Any] | None = None,
        links: Sequence[tuple[Any, dict[str, Any]]] = (),
        error: BaseException | None = None,
    ) -> Any:
        """A span recorded after the fact (its times measured elsewhere), a child of `parent`,
        linked to each (span, link attributes) of `links`; an `error` is recorded on it and marks
        it failed."""
        span = self.tracer.start_span(
            name,
            context=self._trace.set_span_in_context(parent),
            start_time=start_ns,
            attributes=attributes,
            links=[self._trace.Link(linked.get_span_context(), about) for linked, about in links],
        )
        if error is not None:
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, repr(error)))
        span.end(end_time=end_ns)
        return span

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter thread."""
        self.provider.shutdown()


def span(name: str) -> AbstractContextManager[Any]:
    """A child span of the current request's span around a block; a shared no-op when the request
    is not traced or not sampled. An exception leaving the block is recorded on the span."""
    request = request_context.current()
    if not sampled(request):  # off, or this request not sampled: its children would not be either
        return NO_SPAN
    return request.tracer.tracer.start_as_current_span(name)


def span_after(name: str, start: float, end: float) -> None:
    """A child span of the current request's span between two `time.monotonic()` instants measured
    elsewhere (its batch thread's work for it); nothing when the request is not sampled."""
    request = request_context.current()
    if not sampled(request):
        return
    to_ns = epoch_ns()
    request.tracer.span_between(name, request.span, to_ns(start), to_ns(end))


def sampled(request: request_context.RequestContext | None) -> TypeGuard[request_context.RequestContext]:
    return request is not None and request.span is not None and request.span.is_recording()


def epoch_ns() -> Callable[[float], int]:
    """A converter from `time.monotonic()` instants to the epoch nanoseconds spans are stamped with."""
    offset = time.time_ns() - int(time.monotonic() * 1e9)
    return lambda instant: offset + int(instant * 1e9)


class BatchTracing(BatchObserver):
    """The batch observer that traces each batch which served a sampled request: its `queue wait`
    spans and the `batch <model>` span."""

    def __init__(self, model: str, attributes: Callable[[list[Any]], dict[str, Any]]):
        self.model = model
        self.attributes = attributes

    def batch_done(self, run: BatchRun) -> None:
        traced = [(r, enqueued) for r, enqueued in zip(run.requests, run.enqueued, strict=True) if sampled(r)]
        if not traced:
            return
        first = traced[0][0]
        tracing: Tracing = first.tracer
        to_ns = epoch_ns()
        links = []
        for request, enqueued in traced:
            tracing.span_between("queue wait", request.span, to_ns(enqueued), to_ns(run.started))
            links.append((request.span, {"gmlp.request_id": request.request_id}))
        attributes = {
            "gmlp.model": self.model,
            "gmlp.batch.size": run.size,
            "gmlp.batch.instance": run.instance,
            **self.attributes(run.items),
        }
        start, end = to_ns(run.run_start), to_ns(run.run_end)
        tracing.span_between(
            f"batch {self.model}", first.span, start, end, attributes=attributes, links=links, error=run.error
        )
