"""The FastAPI application: `create_app(settings)` and its lifespan (load, warm up, drain).

The lifecycle itself (phases, loading, draining) is `service.state.ServiceState`; this module wires
it to the transports: the HTTP routers (task routes, Hugging Face API, Open Inference Protocol v2),
their error tables and middlewares, and the v2 gRPC server, which the lifespan runs on the same
event loop so that it shares the models and batchers.

Run with `gmlp serve` (service.cli) or `uvicorn --factory service.app:create_app`.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from PIL import Image

from contract.formats import package_version
from service import hf, routes
from service.connections import ConnectionCapMiddleware
from service.dispatch import DirectDispatchMiddleware
from service.errors import (
    REST_ERRORS,
    ErrorResponder,
    UnexpectedErrorMiddleware,
    error_handlers,
    install_error_handlers,
)
from service.http_io import BodyLimitMiddleware
from service.metrics import HttpMetricsMiddleware, ServiceMetrics
from service.settings import ServiceSettings
from service.state import ServiceState
from service.v2 import rest as v2
from service.v2.grpc_server import GrpcServer

# The HTTP APIs, in the order their routes take precedence.
ROUTERS = (routes.router, hf.router, v2.router)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start gRPC (when enabled) and the background model loading; on shutdown stop taking gRPC
    calls (running ones finish), then drain the batchers."""
    state: ServiceState = app.state.service
    grpc_server = GrpcServer(state, state.settings) if state.settings.grpc_port else None
    if grpc_server is not None:
        await grpc_server.start()
    loader = asyncio.create_task(state.load(), name="load-models")
    try:
        yield
    finally:
        if not loader.done():
            loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
        if grpc_server is not None:
            await grpc_server.stop(state.settings.drain_timeout_s)
        await state.shutdown()


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """A new, independent app (own metrics registry, own models) for `settings`."""
    settings = settings or ServiceSettings()
    # The per-image check in preprocessing applies this app's limit before decoding. Pillow's own
    # check is process-wide (shared by every app in the process), so it is only ever raised, never
    # lowered, so that it cannot refuse what this app allows; its warnings repeat our check.
    if Image.MAX_IMAGE_PIXELS is not None and settings.max_image_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    metrics = ServiceMetrics(settings.max_batch_size)
    app = FastAPI(
        title="gmlp-serve",
        summary="gMLP image classification and fill-mask inference with dynamic batching",
        version=package_version(),
        lifespan=lifespan,
    )
    app.state.service = ServiceState(settings, metrics)
    errors = ErrorResponder(
        default=REST_ERRORS,
        by_prefix={v2.PREFIX: v2.V2_ERRORS, hf.PREFIX: hf.HF_ERRORS},
        observe=metrics.refused,
    )
    handlers = error_handlers(errors)
    install_error_handlers(app, handlers)
    for router in ROUTERS:
        app.include_router(router)
    # Each middleware wraps those added before it. From the inside out: the direct dispatch, which
    # answers the routers' direct routes before FastAPI's router would; body and header limits; the
    # connection cap, whose 503 comes before anything else of ours runs (the protocol marks those
    # requests, service.connections); the metrics, which see every answer, including early 413s
    # and 503s; unexpected errors, answered (and counted as 500s) wherever in ours they arise.
    app.add_middleware(
        DirectDispatchMiddleware,
        routes=[route for router in ROUTERS for route in router.routes],
        handlers=handlers,
    )
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_upload_bytes,
        errors=errors,
        max_header_bytes=settings.max_header_bytes,
    )
    app.add_middleware(ConnectionCapMiddleware, errors=errors)
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    app.add_middleware(UnexpectedErrorMiddleware, errors=errors)
    return app


__all__ = ["create_app"]
