"""The composition root: `create_app(settings)` wires the wings to the transports.

The lifecycle itself (phases, loading, draining) is `service.lifecycle.state.ServiceState`; this module
wires it to the transports: the HTTP routers (task routes, Hugging Face API, Open Inference
Protocol v2), their error tables and middlewares (`service.http`), and the v2 gRPC server
(`service.v2.grpc_server`), which the lifespan runs on the same event loop so that it shares the
models and batchers. Only this module, `service.cli` and the package itself import both transports.

Run with `gmlp serve` (service.cli) or `uvicorn --factory service.app:create_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from PIL import Image
from prometheus_client import CollectorRegistry
from starlette.middleware import Middleware

from contract.errors import UserError
from contract.formats import package_version
from service.access.keys import KeyStore
from service.access.tls import TlsFiles
from service.access.watch import Reloadable, reload_all, watch
from service.http import hf, playground, routes
from service.http.admission import CLOSE_OBSERVER, REFUSAL_OBSERVER
from service.http.errors import ErrorResponder
from service.http.gate import RequestGate
from service.http.hosts import HostRule
from service.http.observe import RequestObservationMiddleware
from service.http.routing import RouteTable, error_namespaces, secure_openapi
from service.lifecycle.state import ServiceState
from service.processes.front import FrontState
from service.processes.topology import Topology, WorkerLink
from service.settings import ServiceSettings
from service.telemetry.logs import CLIENT_LINES
from service.telemetry.metrics import ServiceMetrics
from service.telemetry.recent import StatsHistory
from service.telemetry.tracing import Tracing
from service.v2 import rest as v2
from service.v2.grpc_server import start_grpc

log = logging.getLogger(__name__)

# The HTTP APIs, in the order their routes take precedence (the v2 model repository, then the
# playground's pages last).
ROUTERS = (routes.router, hf.router, v2.router, v2.repository_router, playground.router)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """Start gRPC (when enabled), the metrics port, the watcher of the keys and TLS files (and
    SIGHUP) and the background model loading; on shutdown stop taking gRPC calls (running ones
    finish), then drain the batchers. The state yielded reaches uvicorn's protocols."""
    state: ServiceState = app.state.service
    settings = state.settings
    keys, tls, tracing = app.state.keys, app.state.tls, app.state.tracing
    grpc_server = await start_grpc(state, keys, tls, tracing) if settings.grpc_port else None
    metrics_server = start_metrics_port(settings, state.metrics.exposed) if settings.metrics_port else None
    watched: list[Reloadable] = [r for r in (keys, tls) if r is not None and r.paths]
    watcher = asyncio.create_task(watch(watched, settings.reload_interval_s), name="watch-files")
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # main thread only
        loop.add_signal_handler(signal.SIGHUP, reload_all, watched)
    loader = asyncio.create_task(state.load(), name="load-models")
    reporter = None
    if app.state.worker is not None:  # a worker (service.server): it takes connections once loaded
        await asyncio.shield(loader)
        reporter = asyncio.create_task(app.state.worker.report(), name="worker-report")
    # The status view's sampling of the metrics (/stats).
    sampler = asyncio.create_task(app.state.stats.run(), name="stats")
    try:
        yield {REFUSAL_OBSERVER: state.metrics.refused, CLOSE_OBSERVER: state.metrics.connection_closed}
    finally:
        sampler.cancel()
        watcher.cancel()
        if reporter is not None:
            reporter.cancel()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.remove_signal_handler(signal.SIGHUP)
        loader.cancel()  # a no-op once it is done
        await asyncio.gather(loader, sampler, watcher, return_exceptions=True)
        if grpc_server is not None:
            await grpc_server.stop(settings.drain_timeout_s)
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        await state.shutdown()
        if tracing is not None:  # export the spans still buffered
            await asyncio.to_thread(tracing.shutdown)


def start_metrics_port(settings: ServiceSettings, registry: CollectorRegistry) -> Any:
    """/metrics without a key on `metrics_port` (a thread of prometheus_client's own server), with
    the service's certificate when TLS is on; for scrapers on a network that only they reach."""
    from prometheus_client import start_http_server

    tls: dict[str, Any] = {}
    if settings.tls_cert is not None:
        tls = {"certfile": str(settings.tls_cert), "keyfile": str(settings.tls_key)}
        tls["tls_min_version"] = ssl.TLSVersion.TLSv1_2
    server, _ = start_http_server(settings.metrics_port or 0, settings.host, registry, **tls)
    log.info("metrics on %s:%s", settings.host, settings.metrics_port)
    return server


def tls_files(settings: ServiceSettings, metrics: ServiceMetrics) -> TlsFiles | None:
    """The TLS files, checked now (a start-up error when unusable), or None when TLS is off."""
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.tls_client_ca is not None:
            raise UserError("GMLP_TLS_CLIENT_CA needs GMLP_TLS_CERT and GMLP_TLS_KEY (the server's own)")
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise UserError("TLS needs both GMLP_TLS_CERT and GMLP_TLS_KEY")
    return TlsFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca, metrics)


def cors(settings: ServiceSettings) -> list[Middleware]:
    """Starlette's CORS middleware for the configured origins (none: no CORS)."""
    if not settings.cors_origin_list():
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origin_list(),
            allow_credentials=settings.cors_credentials,
            allow_methods=["GET", "POST"],
            allow_headers=[
                "authorization",
                "x-api-key",
                "content-type",
                "inference-header-content-length",
                "x-request-id",
                "traceparent",
                "tracestate",
            ],
            expose_headers=[
                "retry-after",
                "www-authenticate",
                "inference-header-content-length",
                "x-request-id",
                "server-timing",
            ],
        )
    ]


def create_app(
    settings: ServiceSettings | None = None,
    *,
    worker: WorkerLink | None = None,
    topology: Topology | None = None,
) -> FastAPI:
    """A new, independent app (own metrics registry, own models) for `settings`; as a `worker`, the
    server starts listening once the models are loaded (not at once, answering not_ready) and
    reports to its supervisor from then on; as a front-end of a `topology`, its models are its
    engine process's (`service.processes.front`)."""
    settings = settings or ServiceSettings()
    # The per-image check in preprocessing applies this app's limit before decoding. Pillow's own
    # check is process-wide (shared by every app in the process), so it is only ever raised, never
    # lowered, so that it cannot refuse what this app allows; its warnings repeat our check.
    if Image.MAX_IMAGE_PIXELS is not None and settings.max_image_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    metrics = ServiceMetrics(settings.max_batch_size)
    CLIENT_LINES.observe = metrics.log_lines_suppressed.inc  # the process's log, this app's count
    app = FastAPI(
        title="gmlp-serve",
        summary="gMLP image classification and fill-mask inference with dynamic batching",
        version=package_version(),
        lifespan=lifespan,
        # Served by service.http.playground from the package's own copies of their scripts.
        docs_url=None,
        redoc_url=None,
    )
    if topology is None:
        app.state.service = ServiceState(settings, metrics)
        rates = None  # the keys' buckets are this process's
    else:
        app.state.service = front = FrontState(settings, metrics, topology)
        rates = front.link  # ... the engine's, for the whole server
    app.state.worker = worker
    app.state.stats = StatsHistory(metrics, settings.stats_window_s, settings.stats_interval_s)
    app.state.keys = KeyStore(settings.api_keys_file, metrics, rates)
    app.state.tls = tls_files(settings, metrics)
    app.state.tracing = Tracing.from_environment()  # None unless the OTEL_* variables ask for it
    for router in ROUTERS:
        app.include_router(router)
    playground.mount_assets(app)  # the playground's files and the API docs' scripts, under /ui/
    # Every route in the router's order (FastAPI's OpenAPI document, the routers' as included, the
    # mounts) with the key scope it declares: what the request gate matches a request against once
    # and the OpenAPI document reads (an undeclared route stops the app here).
    table = RouteTable(app.router.routes)
    secure_openapi(app, app.state.keys, table)
    # Each route renders its refusals with its own API's table; so do the paths below a router's
    # prefix that no route takes (unknown v2 paths); anything else gets the REST shape.
    errors = ErrorResponder(error_namespaces(ROUTERS), observe=metrics.refused)
    # The layers around every HTTP request, outermost first: the observation sees every answer,
    # refusals and unexpected errors included; CORS (opt-in) answers preflights before access
    # control and adds its headers to every refusal; the gate, innermost, checks the request, limits
    # its body and runs its route with the one exception path (service.http.gate). FastAPI's
    # router is reached for the lifespan only.
    app.user_middleware = [
        Middleware(
            RequestObservationMiddleware,
            metrics=metrics,
            tracing=app.state.tracing,
            access=settings.access_log,
        ),
        *cors(settings),
        Middleware(
            RequestGate,
            table=table,
            errors=errors,
            keys=app.state.keys,
            max_header_bytes=settings.max_header_bytes,
            max_body_bytes=settings.max_upload_bytes,
            hosts=HostRule.from_setting(settings.allowed_hosts, keyed=settings.api_keys_file is not None),
        ),
    ]
    return app
