"""Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`), in the HTTP server's process.

The gRPC server runs on the same event loop as uvicorn and serves the same `ServiceState`, so its
requests join the same dynamic batchers as REST traffic and see the same lifecycle (ready only
after warm-up, draining on shutdown). The limits are the HTTP ones: the largest message is
`max_upload_bytes`, the deadline is the client's gRPC deadline capped by `request_timeout_s`, a full
queue answers UNAVAILABLE. Core errors map to status codes in one table, `GRPC_STATUS`; the
messages are the ones REST clients read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
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
from service.core import requests
from service.core.deadline import Deadline
from service.core.keys import KeyStore
from service.core.metrics import ServiceMetrics
from service.core.requests import REQUEST_ID_HEADER, RequestContext
from service.core.settings import ServiceSettings
from service.core.state import ServiceState
from service.core.tls import TlsFiles
from service.core.tracing import Tracing
from service.v2 import inference, repository
from service.v2.grpc_access import AccessInterceptor, connection_options, server_credentials
from service.v2.inference import InferRequest
from service.v2.model_config import model_config, model_statistics
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from service.v2.tensors import BYTES, Tensor, from_items, from_json, from_raw

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def grpc_status(kind: type[RequestError]) -> grpc.StatusCode:
    """The status code of an error of type `kind`."""
    return most_specific(GRPC_STATUS, kind, grpc.StatusCode.INTERNAL)


def _parameters(
    params: Mapping[str, pb.InferParameter] | Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is not None:
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
            f"input {tensor.name}: {tensor.datatype!r} data must be sent in raw_input_contents",
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
        model_name=request.model_name,
        inputs=inputs,
        outputs=[o.name for o in request.outputs],
        id=request.id,
        parameters=_parameters(request.parameters),
        model_version=request.model_version,
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
    """The protocol's calls over one `ServiceState`."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def _answer(self, context: aio.ServicerContext, work: Awaitable[T]) -> T:
        """Await `work`; a core error becomes its status code and message, a bug INTERNAL (logged)."""
        try:
            return await work
        except RequestError as exc:
            self.state.metrics.refused("grpc", exc.code)
            requests.note_error(exc.code, exc.message)
            await context.abort(grpc_status(type(exc)), exc.message)
        except Exception:
            log.exception("unhandled error in a gRPC call")
            await context.abort(grpc.StatusCode.INTERNAL, "internal server error; the error was logged")
        raise AssertionError("abort returns only by raising")  # pragma: no cover

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=inference.server_live(self.state))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.state.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> Any:
        async def ready() -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(
                ready=inference.model_ready(self.state, request.name, request.version)
            )

        return await self._answer(context, ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(**inference.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: aio.ServicerContext) -> Any:
        async def metadata() -> pb.ModelMetadataResponse:
            meta = inference.model_metadata(self.state, request.name, request.version)
            response = pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"]
            )
            for key in ("inputs", "outputs"):
                getattr(response, key).extend(pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[key])
            return response

        return await self._answer(context, metadata())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: aio.ServicerContext) -> Any:
        async def config() -> pb.ModelConfigResponse:
            document = model_config(self.state, request.name, request.version)
            return pb.ModelConfigResponse(config=json_format.ParseDict(document, pb.ModelConfig()))

        return await self._answer(context, config())

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: aio.ServicerContext) -> Any:
        async def statistics() -> pb.ModelStatisticsResponse:
            document = model_statistics(self.state, request.name, request.version)
            return json_format.ParseDict(document, pb.ModelStatisticsResponse())

        return await self._answer(context, statistics())

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> Any:
        settings = self.state.settings
        remaining = context.time_remaining()
        timeout = (
            settings.request_timeout_s if remaining is None else min(settings.request_timeout_s, remaining)
        )
        deadline = Deadline.after(max(0.0, timeout))

        async def run() -> pb.ModelInferResponse:
            inference.model(self.state, request.model_name, request.model_version)
            return encode_result(await inference.infer(self.state, decode_request(request), deadline))

        return await self._answer(context, run())

    # -- the model-repository extension (control calls: admin scope under access control) ----------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext) -> Any:
        entries = repository.index(self.state, request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: aio.ServicerContext
    ) -> Any:
        async def load() -> pb.RepositoryModelLoadResponse:
            await repository.load(self.state, request.model_name, _parameters(request.parameters))
            return pb.RepositoryModelLoadResponse()

        return await self._answer(context, load())

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: aio.ServicerContext
    ) -> Any:
        async def unload() -> pb.RepositoryModelUnloadResponse:
            await repository.unload(self.state, request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._answer(context, unload())


UnaryCall = Callable[[Any, aio.ServicerContext], Awaitable[Any]]


class UnaryInterceptor(aio.ServerInterceptor):
    """An interceptor that wraps the behaviour of every unary call (`wrap`)."""

    def wrap(self, call: UnaryCall, method: str, details: grpc.HandlerCallDetails) -> UnaryCall:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.wrap(handler.unary_unary, details.method.rsplit("/", 1)[-1], details),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def finished(
    call: UnaryCall, request: Any, context: aio.ServicerContext, done: Callable[[grpc.StatusCode], None]
) -> Any:
    """Run `call`, then `done(code)` with its final status code (OK, or the code it failed with)."""
    code = grpc.StatusCode.OK
    try:
        return await call(request, context)
    except BaseException:
        code = context.code() or grpc.StatusCode.UNKNOWN
        raise
    finally:
        done(code)


class CallMetrics(UnaryInterceptor):
    """Counts and times every unary call by method and final status code (the gRPC side of what
    the HTTP metrics middleware does), so an operator sees both transports."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def wrap(self, call: UnaryCall, method: str, details: grpc.HandlerCallDetails) -> UnaryCall:
        metrics = self.metrics

        async def timed(request: Any, context: aio.ServicerContext) -> Any:
            start = time.perf_counter()

            def done(code: grpc.StatusCode) -> None:
                metrics.grpc_call(method, code.name, time.perf_counter() - start)

            return await finished(call, request, context, done)

        return timed


class CallObservation(UnaryInterceptor):
    """The request id (`x-request-id` metadata: the client's when acceptable, else generated; sent
    back in the initial metadata of every call) and, with tracing on, the call's SERVER span
    continuing a `traceparent` in the metadata: the gRPC side of `service.http.observe`."""

    def __init__(self, tracing: Tracing | None) -> None:
        self.tracing = tracing

    def wrap(self, call: UnaryCall, method: str, details: grpc.HandlerCallDetails) -> UnaryCall:
        metadata = {key: value for key, value in details.invocation_metadata or () if isinstance(value, str)}
        tracing = self.tracing

        async def observed(request: Any, context: aio.ServicerContext) -> Any:
            given = metadata.get(REQUEST_ID_HEADER)
            call_context = RequestContext(
                requests.accepted_request_id(given), "grpc", method=method, route=method
            )
            await context.send_initial_metadata(((REQUEST_ID_HEADER, call_context.request_id),))
            if tracing is None:
                with requests.open_request(call_context):
                    return await call(request, context)
            attributes = {
                "rpc.system": "grpc",
                "rpc.method": method,
                "gmlp.request_id": call_context.request_id,
            }
            call_context.span = tracing.start_server_span(details.method.lstrip("/"), metadata, attributes)
            call_context.tracer = tracing
            token = tracing.activate(call_context.span)

            def done(code: grpc.StatusCode) -> None:
                status = {"rpc.grpc.status_code": code.value[0]}
                tracing.end_server_span(call_context, code.name, status, failed=code != grpc.StatusCode.OK)
                tracing.deactivate(token)

            with requests.open_request(call_context):
                return await finished(call, request, context, done)

        return observed


class GrpcServer:
    """A `grpc.aio` server on the running event loop, started and stopped by the app's lifespan;
    with `keys`, calls need the key their method's scope asks for; with `tls`, TLS (or mutual TLS)."""

    def __init__(
        self,
        state: ServiceState,
        settings: ServiceSettings,
        *,
        keys: KeyStore | None = None,
        tls: TlsFiles | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        # The observation outermost, so that the metrics' handling runs inside the request; then the
        # metrics, so that they also count the calls access control refuses.
        interceptors: list[aio.ServerInterceptor] = [CallObservation(tracing), CallMetrics(state.metrics)]
        if keys is not None:
            interceptors.append(AccessInterceptor(keys, state.metrics, grpc_status))
        self.server = aio.server(interceptors=interceptors, options=connection_options(settings))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(state), self.server)
        self.address = f"{settings.host}:{settings.grpc_port}"
        self.tls = tls
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; the bound port (raises when the address cannot be bound)."""
        if self.tls is not None:
            self.port = self.server.add_secure_port(self.address, server_credentials(self.tls))
        else:
            self.port = self.server.add_insecure_port(self.address)
        await self.server.start()
        log.info("gRPC (Open Inference Protocol v2) on %s", self.address)
        return self.port

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let running ones finish for up to `grace` seconds."""
        await self.server.stop(grace)


__all__ = [
    "GrpcServer",
    "CallMetrics",
    "CallObservation",
    "InferenceServicer",
    "GRPC_STATUS",
    "grpc_status",
    "decode_request",
    "encode_result",
]
