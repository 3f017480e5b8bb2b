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
from collections.abc import Mapping
from typing import Any

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
from contract.messages import echo
from contract.tensors import BYTES, Tensor, from_items, from_json, from_raw
from service.access.keys import KeyStore
from service.access.tls import TlsFiles
from service.engine.request_context import Deadline, encode_off_loop
from service.lifecycle.state import ServiceState
from service.settings import ServiceSettings
from service.tasks.pipeline import Pipeline
from service.telemetry.tracing import Tracing
from service.v2 import inference
from service.v2.grpc_calls import CallHandling, connection_options, server_credentials
from service.v2.inference import InferRequest
from service.v2.model_config import model_config, model_statistics
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

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
        inputs=inputs,
        outputs=[o.name for o in request.outputs],
        id=request.id,
        parameters=_parameters(request.parameters),
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
        meta = inference.model_metadata(
            self.state, inference.resolve(self.state, request.name, request.version)
        )
        response = pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for key in ("inputs", "outputs"):
            getattr(response, key).extend(pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[key])
        return response

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: aio.ServicerContext) -> Any:
        document = model_config(self.state, inference.resolve(self.state, request.name, request.version))
        return pb.ModelConfigResponse(config=json_format.ParseDict(document, pb.ModelConfig()))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: aio.ServicerContext) -> Any:
        document = model_statistics(self.state, request.name, request.version)
        return json_format.ParseDict(document, pb.ModelStatisticsResponse())

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> Any:
        settings = self.state.settings
        remaining = context.time_remaining()
        timeout = (
            settings.request_timeout_s if remaining is None else min(settings.request_timeout_s, remaining)
        )
        deadline = Deadline.after(max(0.0, timeout))
        model = inference.resolve(self.state, request.model_name, request.model_version)
        with self.state.lease(model.name, model.version, kind=Pipeline) as served:  # held until answered
            result = await inference.infer(self.state, model, served, decode_request(request), deadline)
        return await encode_off_loop(lambda: encode_result(result), result.size.total)

    # -- the model-repository extension (control calls: admin scope under access control) ----------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext) -> Any:
        entries = self.state.table.index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**vars(entry)) for entry in entries]
        )

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
        handling = CallHandling(state.metrics, grpc_status, service=SERVICE_NAME, keys=keys, tracing=tracing)
        self.server = aio.server(options=connection_options(settings))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(
            handling.servicer(InferenceServicer(state)), self.server
        )
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
