"""What every gRPC connection and call goes through: the connection limits and TLS, and around its
servicer method the request id, the call's span, its metrics, access control and the one exception
path.

This is one wrapper per method, applied once when the servicer is registered, rather than
`grpc.aio` server interceptors: an interceptor is awaited on every call and hands back a new method
handler each time, and each layer adds a coroutine to the call; at a batched model server's call
rates that cost about as much CPU as the rest of the call. A wrapper costs one coroutine per call.

The request id (`x-request-id` metadata: the client's when acceptable, else generated) comes back
in the trailing metadata, sent with the status at no extra cost. The key comes as `authorization`
metadata (`Bearer KEY`, what tritonclient sends from its `headers`) or `x-api-key`; a refused call
never reaches the servicer. TLS comes from the same files as HTTPS (`service.access.tls`), re-read
when they change: gRPC asks for the current certificate at each new connection's handshake.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

import grpc
from grpc import aio

from contract.errors import RateLimited, RequestError
from service.access.keys import KeyStore, presented_key
from service.access.scope import grpc_scope
from service.access.tls import TlsFiles
from service.engine import request_context
from service.engine.request_context import REQUEST_ID_HEADER, RequestContext
from service.settings import ServiceSettings
from service.telemetry.metrics import ServiceMetrics
from service.telemetry.tracing import Tracing

log = logging.getLogger(__name__)
UnaryCall = Callable[[Any, aio.ServicerContext], Awaitable[Any]]
StatusTable = Callable[[type[RequestError]], grpc.StatusCode]


def metadata_credential(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The key in a call's metadata (`presented_key`); binary metadata is never a key."""
    return presented_key((name, value) for name, value in metadata or () if isinstance(value, str))


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """TLS credentials that take the current certificate at each handshake (TLS 1.2+, gRPC's
    default strong suites); a client certificate is required when a client CA is configured."""

    def configuration() -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(tls.pem.key, tls.pem.cert)], root_certificates=tls.pem.client_ca
        )

    served = tls.generation

    def fetch() -> Any:
        nonlocal served
        if tls.generation == served:
            return None
        served = tls.generation
        return configuration()

    return grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=tls.mutual
    )


def connection_options(settings: ServiceSettings) -> list[tuple[str, Any]]:
    """The server's limits on connections: message size, keepalive pings (a client may ping at most
    every 60 s without calls; abusers are disconnected), idle and maximum age (clients reconnect,
    which also spreads them over replicas), the handshake's deadline, and the number of open
    connections: gRPC core counts each from accept until it closes and closes one over
    `grpc_max_connections` at once, before its handshake (what bounds descriptors: an HTTP/2
    stream limit would not)."""
    ms = 1000
    return [
        ("grpc.max_receive_message_length", settings.max_upload_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 60 * ms),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.max_connection_idle_ms", int(settings.grpc_max_connection_idle_s * ms)),
        ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * ms)),
        ("grpc.max_connection_age_grace_ms", int(settings.drain_timeout_s * ms)),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * ms)),
        ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
    ]


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
        metrics, tracing = self.metrics, self.tracing

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
                    try:
                        if keys is not None and scope is not None:
                            keys.authorize(metadata_credential(metadata), scope, "grpc")
                        return await call(request, context)
                    except Exception as exc:
                        await self.abort(context, exc, trailer)
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

    async def abort(
        self, context: aio.ServicerContext, exc: Exception, trailer: tuple[tuple[str, str], ...]
    ) -> NoReturn:
        """The one exception path of every call: a core error aborts with its status code, the
        message REST clients read and, over a key's rate, a `retry-after` trailer; anything else is
        a bug, logged and answered INTERNAL with nothing internal shown."""
        if isinstance(exc, RequestError):
            self.metrics.refused("grpc", exc.code)
            request_context.note_error(exc.code, exc.message)
            status, message = self.status(type(exc)), exc.message
            if isinstance(exc, RateLimited):
                trailer = (*trailer, ("retry-after", str(exc.retry_after_s)))
        else:
            log.error("unhandled error in a gRPC call", exc_info=exc)
            status, message = grpc.StatusCode.INTERNAL, "internal server error; the error was logged"
        await context.abort(status, message, trailing_metadata=trailer)
        raise AssertionError("abort returns only by raising")  # pragma: no cover
