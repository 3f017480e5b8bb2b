"""The composition root: `create_app(settings)` wires the core to the transports.

The lifecycle itself (phases, loading, draining) is `service.core.state.ServiceState`; this module
wires it to the transports: the HTTP routers (task routes, Hugging Face API, Open Inference
Protocol v2), their error tables and middlewares (`service.http`), and the v2 gRPC server
(`service.v2.grpc_server`), which the lifespan runs on the same event loop so that it shares the
models and batchers. Only this module, `service.cli` and the package itself import both transports.

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
from service.core.metrics import ServiceMetrics
from service.core.settings import ServiceSettings
from service.core.state import ServiceState
from service.http import hf, routes
from service.http.connections import ConnectionCapMiddleware
from service.http.direct import error_namespaces
from service.http.dispatch import DirectDispatchMiddleware
from service.http.errors import (
    REST_ERRORS,
    ErrorResponder,
    UnexpectedErrorMiddleware,
    error_handlers,
    install_error_handlers,
)
from service.http.limits import BodyLimitMiddleware
from service.http.metrics import HttpMetricsMiddleware
from service.v2 import repository_rest
from service.v2 import rest as v2
from service.v2.grpc_server import GrpcServer

# The HTTP APIs, in the order their routes take precedence.
ROUTERS = (routes.router, hf.router, v2.router, repository_rest.router)  # the last: v2 model repository


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
    direct_routes = [route for router in ROUTERS for route in router.routes]
    # Each route renders its refusals with its own API's table; so do the paths below a router's
    # prefix that no route takes (unknown v2 paths); anything else gets the REST shape.
    errors = ErrorResponder(
        default=REST_ERRORS,
        routes=direct_routes,
        namespaces=error_namespaces(ROUTERS),
        observe=metrics.refused,
    )
    handlers = error_handlers(errors)
    install_error_handlers(app, handlers)
    for router in ROUTERS:
        app.include_router(router)
    # Each middleware wraps those added before it. From the inside out: the direct dispatch, which
    # answers the routers' direct routes before FastAPI's router would; body and header limits; the
    # connection cap, whose 503 comes before anything else of ours runs (the protocol marks those
    # requests, service.http.connections); the metrics, which see every answer, including early 413s
    # and 503s; unexpected errors, answered (and counted as 500s) wherever in ours they arise.
    app.add_middleware(DirectDispatchMiddleware, routes=direct_routes, handlers=handlers)
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
