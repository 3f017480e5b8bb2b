"""Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`), in the HTTP server's process.

The gRPC server runs on the same event loop as uvicorn and serves the same `ServiceState`, so its
requests join the same dynamic batchers as REST traffic and see the same lifecycle. The limits are
the HTTP ones: the largest message is `max_upload_bytes`, the deadline is the client's gRPC
deadline capped by `request_timeout_s`. Core errors map to status codes in one table,
`GRPC_STATUS`; the messages are the ones REST clients read.

Around each servicer method (`CallHandling`): the request id (back in the trailing metadata), the
call's span, its metrics, access control, the one exception path and a request message that does
not parse (`lenient`: INVALID_ARGUMENT, not gRPC core's logged traceback). This is one wrapper per
method, applied once when the servicer is registered, rather than `grpc.aio` server interceptors:
an interceptor is awaited on every call and hands back a new method handler each time; at a
batched model server's call rates that costs about as much CPU as the rest of the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc import aio

from contract.errors import (
    ClientGone,
    DeadlineExceeded,
    ErrorCode,
    InputTooLarge,
    InvalidInput,
    ModelNotFound,
    PermissionDenied,
    RateLimited,
    RequestError,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
    most_specific,
)
from contract.messages import echo
from contract.tensors import BYTES, Tensor, from_items, from_json, from_raw
from service.access.keys import KeyStore, presented_key
from service.access.scope import grpc_scope
from service.access.tls import TlsFiles
from service.engine import request_context
from service.engine.request_context import REQUEST_ID_HEADER, Deadline, RequestContext, encode_off_loop
from service.lifecycle.state import ServiceState
from service.tasks.pipeline import Pipeline
from service.telemetry.metrics import ServiceMetrics
from service.telemetry.tracing import Tracing
from service.v2 import inference
from service.v2.grpc_limits import connection_options
from service.v2.inference import InferRequest
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
UnaryCall = Callable[[Any, aio.ServicerContext], Awaitable[Any]]
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]

GRPC_STATUS: Mapping[type[RequestError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    UnsupportedMediaType: grpc.StatusCode.INVALID_ARGUMENT,
    InputTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    Unavailable: grpc.StatusCode.UNAVAILABLE,  # queue full, not ready, shutting down
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    ClientGone: grpc.StatusCode.CANCELLED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    RateLimited: grpc.StatusCode.RESOURCE_EXHAUSTED,  # with a retry-after trailer
}

# Which typed `contents` field carries each datatype (FP16 has none: it travels raw).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}


def _parameters(
    params: Mapping[str, pb.InferParameter] | Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if (kind := value.WhichOneof("parameter_choice")) is not None:
            out[key] = getattr(value, kind)
    return out


def _input(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Tensor:
    shape = list(tensor.shape)
    if raw is not None:
        return from_raw(tensor.name, tensor.datatype, shape, raw)
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        raise InvalidInput(
            ErrorCode.INVALID_INPUTS,
            f"input {tensor.name}: {echo(tensor.datatype)} data must be sent in raw_input_contents",
        )
    values = list(getattr(tensor.contents, field))
    if tensor.datatype == BYTES:
        return from_items(tensor.name, shape, values)
    return from_json(tensor.name, tensor.datatype, shape, values)


def decode_request(request: pb.ModelInferRequest) -> InferRequest:
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise InvalidInput(
            ErrorCode.INVALID_INPUTS,
            f"{len(raws)} raw_input_contents for {len(request.inputs)} inputs; send one per input",
        )
    inputs = [_input(t, raws[i] if raws else None) for i, t in enumerate(request.inputs)]
    return InferRequest(
        inputs, [o.name for o in request.outputs], request.id, _parameters(request.parameters)
    )


def encode_result(result: inference.InferResult) -> pb.ModelInferResponse:
    """Every output as raw contents (what Triton answers; both stock clients read it)."""
    response = pb.ModelInferResponse(
        model_name=result.model_name, model_version=result.model_version, id=result.id
    )
    for tensor in result.outputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor.raw())
    return response


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The protocol's calls over one `ServiceState`; what they raise is answered by the calls'
    one exception path (`CallHandling.abort`: core errors by `GRPC_STATUS`, bugs INTERNAL)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=inference.server_live(self.state))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.state.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> Any:
        model = inference.resolve(self.state, request.name, request.version)
        return pb.ModelReadyResponse(ready=self.state.version_ready(model.name, model.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(**inference.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: aio.ServicerContext) -> Any:
        model = inference.resolve(self.state, request.name, request.version)
        document = inference.model_metadata(self.state, model)
        return json_format.ParseDict(document, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: aio.ServicerContext) -> Any:
        model = inference.resolve(self.state, request.name, request.version)
        document = inference.model_config(self.state, model)
        return pb.ModelConfigResponse(config=json_format.ParseDict(document, pb.ModelConfig()))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: aio.ServicerContext) -> Any:
        document = inference.model_statistics(self.state, request.name, request.version)
        return json_format.ParseDict(document, pb.ModelStatisticsResponse())

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> Any:
        limit, remaining = self.state.settings.request_timeout_s, context.time_remaining()
        timeout = limit if remaining is None else min(limit, remaining)
        deadline = Deadline.after(max(0.0, timeout))
        model = inference.resolve(self.state, request.model_name, request.model_version)
        with self.state.lease(model.name, model.version, kind=Pipeline) as served:  # held until answered
            result = await inference.infer(self.state, model, served, decode_request(request), deadline)
        return await encode_off_loop(lambda: encode_result(result), result.size.total)

    # -- the model-repository extension (control calls: admin scope under access control) ----------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext) -> Any:
        entries = [vars(entry) for entry in self.state.index(request.ready)]
        return json_format.ParseDict({"models": entries}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: aio.ServicerContext
    ) -> Any:
        await inference.load_model(self.state, request.model_name, _parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: aio.ServicerContext
    ) -> Any:
        await self.state.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()


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
        configuration(), fetch, require_client_authentication=tls.client_ca is not None
    )


@dataclass(frozen=True)
class CallHandling:
    """Wraps the servicer's methods (`servicer(...)`); `keys` None: no access control."""

    metrics: ServiceMetrics
    keys: KeyStore | None
    tracing: Tracing | None

    def register(self, servicer: Any, server: aio.Server) -> None:
        """Serve `servicer`'s methods on `server`, each wrapped, as the generated registration
        does but with a `lenient` parser of each request message."""
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self.wrap(getattr(servicer, name), name),
                request_deserializer=lenient(getattr(pb, method.input_type.name)),
                response_serializer=getattr(pb, method.output_type.name).SerializeToString,
            )
            for name, method in SERVICE.methods_by_name.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
        server.add_registered_method_handlers(SERVICE.full_name, handlers)

    def wrap(self, call: UnaryCall, method: str) -> UnaryCall:
        """`call` with the request id, span, metrics and access control of method `method`."""
        full_name = f"/{SERVICE.full_name}/{method}"
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
                token = tracing.start_server_span(call_context, full_name.lstrip("/"), carrier, attributes)
            code = grpc.StatusCode.OK
            try:
                with request_context.open_request(call_context):
                    try:
                        if keys is not None and scope is not None:
                            text = [(k, v) for k, v in metadata if isinstance(v, str)]  # binary is no key
                            await keys.authorize(presented_key(text), scope, "grpc")
                        if isinstance(request, Malformed):
                            raise InvalidInput(ErrorCode.INVALID_REQUEST, request.reason)
                        return await call(request, context)
                    except Exception as exc:
                        await self.abort(context, exc, trailer)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                metrics.grpc_calls.labels(method, code.name).inc()
                metrics.grpc_latency.labels(method, code.name).observe(time.perf_counter() - start)
                if tracing is not None:
                    attributes = {"rpc.grpc.status_code": code.value[0]}
                    failed = code != grpc.StatusCode.OK
                    tracing.end_server_span(call_context, token, code.name, attributes, failed=failed)

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
            status = most_specific(GRPC_STATUS, type(exc), grpc.StatusCode.INTERNAL)
            message = exc.message
            if isinstance(exc, RateLimited):
                trailer = (*trailer, ("retry-after", str(exc.retry_after_s)))
        else:
            log.error("unhandled error in a gRPC call", exc_info=exc)
            status, message = grpc.StatusCode.INTERNAL, "internal server error; the error was logged"
        try:
            await context.abort(status, message, trailing_metadata=trailer)
        except aio.AbortError:
            raise
        except Exception as failed:
            if type(failed).__name__ != "ExecuteBatchError":  # gRPC core's, with no public name
                raise
            # The status could not be sent: the call had ended (its client left) before the abort,
            # which is no error of ours. One line, and the call ends as a cancelled one, which gRPC
            # logs at debug level instead of a traceback.
            log.info(
                "gRPC call ended before its status %s could be sent: %s",
                status.name,
                message,
                extra={"client_caused": True},
            )
            raise asyncio.CancelledError from None
        raise AssertionError("abort returns only by raising")  # pragma: no cover


@dataclass(frozen=True)
class Malformed:
    """A request message that does not parse, answered INVALID_ARGUMENT by the call's wrapper: gRPC
    core would log a deserializer's exception as a traceback and answer UNKNOWN."""

    reason: str


def lenient(message: Any) -> Callable[[bytes], Any]:
    """A parser of protobuf `message` that returns `Malformed` for bytes that are not one."""

    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {message.DESCRIPTOR.full_name} message: {exc}")

    return parse


async def start_grpc(
    state: ServiceState, keys: KeyStore | None, tls: TlsFiles | None, tracing: Tracing | None
) -> aio.Server:
    """A `grpc.aio` server serving `state` on the running event loop, bound and started (raises
    when the address cannot be bound); with `keys`, calls need the key their method's scope asks
    for; with `tls`, TLS (or mutual TLS). The app's lifespan stops it (`stop(grace)`: new calls
    refused, running ones given `grace` seconds)."""
    settings = state.settings
    handling = CallHandling(state.metrics, keys, tracing)
    server = aio.server(options=connection_options(settings))
    handling.register(InferenceServicer(state), server)
    address = f"{settings.host}:{settings.grpc_port}"
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, server_credentials(tls))
    await server.start()
    log.info("gRPC (Open Inference Protocol v2) on %s", address)
    return server
