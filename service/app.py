"""The FastAPI application: `create_app(settings)` and its lifespan (load, warm up, drain).

Models load in a background task after the server starts listening, so that liveness answers at
once and readiness turns 200 only when every model is loaded *and* has run a warm-up batch (the
first ORT runs allocate memory and are slow; a load balancer should not send traffic before).
On shutdown, readiness turns 503 first, then every batcher stops accepting, finishes what is queued
or running (bounded by `drain_timeout_s`), and only then are the sessions released.

Run with `gmlp serve` (service.cli) or `uvicorn --factory service.app:create_app`.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from PIL import Image

from service.errors import ServiceError, install_error_handlers
from service.http_io import BodyLimitMiddleware
from service.metrics import HttpMetricsMiddleware, ServiceMetrics
from service.pipelines import ServedModel, load_model
from service.repository import MLM_TASK, TASKS, VISION_TASK, ServedModelSpec, prepare_repository
from service.runtime import resolve_device
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

LOADING, READY, FAILED, DRAINING = "loading", "ready", "failed", "draining"


class ServiceState:
    """Everything the routes need: settings, metrics, loaded models and the lifecycle phase."""

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        self.defaults: dict[str, str | None] = {task: None for task in TASKS}
        self.phase = LOADING
        self.error: str | None = None

    @property
    def ready(self) -> bool:
        return self.phase == READY

    async def load(self) -> None:
        """Find, load and warm up every model; then pick the per-task defaults."""
        try:
            settings = self.settings
            specs: dict[str, ServedModelSpec] = await asyncio.to_thread(
                prepare_repository, settings.model_repository, settings.checkpoint_dir
            )
            device = resolve_device(settings.device)
            for spec in specs.values():
                model = await asyncio.to_thread(load_model, spec, settings, device, self.metrics)
                model.batcher.start()
                model.ready = True
                self.metrics.model_ready.labels(model.name).set(1)
                self.models[spec.name] = model
            self.defaults = self._pick_defaults()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.phase, self.error = FAILED, f"{type(exc).__name__}: {exc}"
            log.exception("loading the model repository failed; the service will not become ready")
            return
        self.phase = READY
        log.info(
            "ready: %s",
            ", ".join(
                f"{m.name} ({m.task}, {m.variant}, {m.runtime.provider})" for m in self.models.values()
            ),
        )

    def _pick_defaults(self) -> dict[str, str | None]:
        configured = {
            VISION_TASK: self.settings.default_classifier,
            MLM_TASK: self.settings.default_fill_mask,
        }
        defaults: dict[str, str | None] = {}
        for task in TASKS:
            name = configured[task]
            if name is not None and (name not in self.models or self.models[name].task != task):
                raise ValueError(f"default {task} model {name!r} is not a served {task} model")
            defaults[task] = name or next((m.name for m in self.models.values() if m.task == task), None)
        return defaults

    def resolve(self, name: str | None, task: str | None) -> ServedModel:
        """The model a request names (or the task's default); 404/422/503 with what is available."""
        if not self.ready:
            raise self.not_ready_error()
        same_task = sorted(m.name for m in self.models.values() if task is None or m.task == task)
        if name is None:
            assert task is not None
            name = self.defaults.get(task)
            if name is None:
                raise ServiceError(404, "no_model", f"no {task} model is served")
        model = self.models.get(name)
        if model is None:
            raise ServiceError(
                404,
                "model_not_found",
                f"model {name!r} is not served; {task or 'served'} models: {same_task}",
            )
        if task is not None and model.task != task:
            raise ServiceError(
                422, "wrong_task", f"model {name!r} is a {model.task} model; {task} models: {same_task}"
            )
        return model

    def not_ready_error(self) -> ServiceError:
        if self.phase == FAILED:
            return ServiceError(503, "not_ready", f"the service failed to load its models: {self.error}")
        message = {LOADING: "the models are still loading", DRAINING: "the service is shutting down"}[
            self.phase
        ]
        return ServiceError(503, "not_ready", message, headers={"Retry-After": "1"})

    async def shutdown(self) -> None:
        """Stop accepting, finish queued and running requests, release the sessions."""
        self.phase = DRAINING
        timeout = self.settings.drain_timeout_s
        results = await asyncio.gather(
            *(m.batcher.close(timeout) for m in self.models.values()), return_exceptions=True
        )
        for model, result in zip(self.models.values(), results, strict=True):
            if isinstance(result, Exception):
                log.error("closing model %s failed: %r", model.name, result)
            self.metrics.model_ready.labels(model.name).set(0)
        log.info("drained and closed %d models", len(self.models))


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServiceState = app.state.service
    loader = asyncio.create_task(state.load(), name="load-models")
    try:
        yield
    finally:
        if not loader.done():
            loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
        await state.shutdown()


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """A new, independent app (own metrics registry, own models) for `settings`."""
    from service import kserve, routes  # routes import this module for get_state

    settings = settings or ServiceSettings()
    # The per-image check in preprocess applies this app's limit before decoding. Pillow's own check
    # is process-wide (shared by every app in the process), so it is only ever raised, never lowered,
    # so that it cannot refuse what this app allows; its warnings are redundant with our check.
    if Image.MAX_IMAGE_PIXELS is not None and settings.max_image_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    metrics = ServiceMetrics(settings.max_batch_size)
    app = FastAPI(
        title="gmlp-serve",
        summary="gMLP image classification and fill-mask inference with dynamic batching",
        version="1.0.0",
        lifespan=lifespan,
    )
    app.state.service = ServiceState(settings, metrics)
    install_error_handlers(app)
    app.include_router(routes.router)
    app.include_router(kserve.router)
    # Outermost first in the stack: metrics see every response, including early 413s.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_upload_bytes)
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    return app


__all__ = ["create_app", "ServiceState", "get_state", "LOADING", "READY", "FAILED", "DRAINING"]
