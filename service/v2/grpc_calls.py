"""What every gRPC call goes through before and after its servicer method: the request id, the
call's span, its metrics and access control.

This is one wrapper per method, applied once when the servicer is registered, rather than
`grpc.aio` server interceptors: an interceptor is awaited on every call and hands back a new
method handler each time, and each of its layers adds a coroutine to the call. At the call rates
of a batched model server that framework work cost about as much CPU as the rest of the gRPC
call, and made gRPC the slower transport; a wrapper costs one coroutine per call.

The request id (`x-request-id` metadata: the client's when acceptable, else generated) comes back
in the trailing metadata, which is sent with the status at no extra cost; the initial metadata
would be a separate write before the answer. The layers, outermost first: observation (request
context and, with tracing on, a SERVER span continuing a `traceparent`), metrics (every call by
method and final status code, refused ones too), then access control (the key the method's scope
asks for, `service.access.scope`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from contract.errors import PermissionDenied, RateLimited, RequestError, Unauthenticated
from service.access.keys import KeyStore
from service.access.scope import grpc_scope
from service.engine import request_context
from service.engine.request_context import REQUEST_ID_HEADER, RequestContext
from service.telemetry.metrics import ServiceMetrics
from service.telemetry.tracing import Tracing
from service.v2.grpc_access import metadata_credential

UnaryCall = Callable[[Any, aio.ServicerContext], Awaitable[Any]]
StatusTable = Callable[[type[RequestError]], grpc.StatusCode]


class CallHandling:
    """Wraps the servicer's methods (`servicer(...)`); `keys` None: no access control."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        status: StatusTable,
        *,
        service: str,
        keys: KeyStore | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.metrics = metrics
        self.status = status
        self.service = service
        self.keys = keys
        self.tracing = tracing

    def servicer(self, servicer: Any) -> Any:
        """An object whose attributes are `servicer`'s methods, each wrapped (what the generated
        registration function reads once per method)."""
        handling = self

        class Wrapped:
            def __getattr__(self, name: str) -> UnaryCall:
                return handling.wrap(getattr(servicer, name), name)

        return Wrapped()

    def wrap(self, call: UnaryCall, method: str) -> UnaryCall:
        """`call` with the request id, span, metrics and access control of method `method`."""
        full_name = f"/{self.service}/{method}"
        scope = grpc_scope(full_name)
        keyed = self.keys is not None and scope is not None and scope not in self.keys.open_scopes
        keys = self.keys if keyed else None
        metrics, status, tracing = self.metrics, self.status, self.tracing

        async def handled(request: Any, context: aio.ServicerContext) -> Any:
            start = time.perf_counter()
            metadata = context.invocation_metadata() or ()
            given = next((v for k, v in metadata if k == REQUEST_ID_HEADER), None)
            request_id = request_context.accepted_request_id(given)
            call_context = RequestContext(request_id, "grpc", method=method, route=method)
            trailer: tuple[tuple[str, str], ...] = ((REQUEST_ID_HEADER, request_id),)
            context.set_trailing_metadata(trailer)
            token = None
            if tracing is not None:
                carrier = {k: v for k, v in metadata if isinstance(v, str)}
                attributes = {"rpc.system": "grpc", "rpc.method": method, "gmlp.request_id": request_id}
                call_context.span = tracing.start_server_span(full_name.lstrip("/"), carrier, attributes)
                call_context.tracer = tracing
                token = tracing.activate(call_context.span)
            code = grpc.StatusCode.OK
            try:
                with request_context.open_request(call_context):
                    if keys is not None:
                        await _authorize(keys, metrics, status, metadata, scope, context, trailer)
                    return await call(request, context)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                metrics.grpc_call(method, code.name, time.perf_counter() - start)
                if tracing is not None:
                    failed = code != grpc.StatusCode.OK
                    tracing.end_server_span(
                        call_context, code.name, {"rpc.grpc.status_code": code.value[0]}, failed=failed
                    )
                    tracing.deactivate(token)

        return handled


async def _authorize(
    keys: KeyStore,
    metrics: ServiceMetrics,
    status: StatusTable,
    metadata: Any,
    scope: Any,
    context: aio.ServicerContext,
    trailer: tuple[tuple[str, str], ...],
) -> None:
    """Aborts the call (its status, the message REST clients read, a `retry-after` trailer over the
    key's rate) unless its metadata carries a key of `scope`."""
    try:
        keys.authorize(metadata_credential(metadata), scope, "grpc")
    except (Unauthenticated, PermissionDenied, RateLimited) as exc:
        metrics.refused("grpc", exc.code)
        request_context.note_error(exc.code, exc.message)
        if isinstance(exc, RateLimited):
            trailer = (*trailer, ("retry-after", str(exc.retry_after_s)))
        await context.abort(status(type(exc)), exc.message, trailing_metadata=trailer)


__all__ = ["CallHandling"]
