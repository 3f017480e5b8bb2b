"""The service's domain state: its pipelines, their per-task defaults and the lifecycle phase.

Models load in the background after the server starts listening, so that liveness answers at once
and readiness turns true only when every model is loaded *and* has run a warm-up batch (the first
ORT runs allocate memory and are slow; a load balancer should not send traffic before). On
shutdown, readiness turns false first, then every batcher stops accepting, finishes what is queued
or running (bounded by `drain_timeout_s`), and only then are the sessions released.

Nothing here knows a transport: refusals are `contract.errors` errors.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from contract.errors import ErrorCode, InvalidInput, ModelNotFound, NotReady
from contract.formats import MLM_TASK, TASKS, VISION_TASK
from contract.spec import ModelSpec, require_models
from service.core import requests
from service.core.metrics import ServiceMetrics
from service.core.pipelines import Pipeline, load_pipeline
from service.core.runtime import resolve_device
from service.core.settings import ServiceSettings

log = logging.getLogger(__name__)

LOADING, READY, FAILED, DRAINING = "loading", "ready", "failed", "draining"

P = TypeVar("P", bound=Pipeline)


class ServiceState:
    """The running service as every transport sees it: settings, metrics, the loaded pipelines by
    name, the default model per task, and the lifecycle phase (loading, ready, failed, draining).

    One instance per app, shared by the HTTP routes and the gRPC server, so that both resolve the
    same models, feed the same batchers and turn ready and drain together. `resolve` and `model`
    are the only ways a request reaches a pipeline: they refuse while the service is not ready
    and say which models the request could have named.
    """

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        metrics.request_timeout.set(settings.request_timeout_s)
        self.models: dict[str, Pipeline] = {}
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
            specs: dict[str, ModelSpec] = await asyncio.to_thread(require_models, settings.model_repository)
            device = resolve_device(settings.device)
            for spec in specs.values():
                model = await asyncio.to_thread(load_pipeline, spec, settings, device, self.metrics)
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

    def model(self, name: str, *, loaded_only: bool = False) -> Pipeline:
        """The served model called `name`, whatever its task; ModelNotFound lists the served ones.

        Requests to run a model need the service ready; `loaded_only` serves metadata of the models
        loaded so far."""
        if not loaded_only and not self.ready:
            raise self.not_ready_error()
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND,
                f"model {name!r} is not served; served models: {sorted(self.models)}",
            )
        requests.note_model(model.name)
        return model

    def resolve(self, name: str | None, kind: type[P]) -> P:
        """The `kind` pipeline a request names (or the task's default), with what else is available."""
        if not self.ready:
            raise self.not_ready_error()
        task = kind.task
        if name is None:
            name = self.defaults.get(task)
            if name is None:
                raise ModelNotFound(ErrorCode.NO_MODEL, f"no {task} model is served")
        model = self.models.get(name)
        if isinstance(model, kind):
            requests.note_model(model.name)
            return model
        # Refused: list what the request could have named (only now, off the per-request path).
        same_task = sorted(m.name for m in self.models.values() if m.task == task)
        if model is None:
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND, f"model {name!r} is not served; {task} models: {same_task}"
            )
        raise InvalidInput(
            ErrorCode.WRONG_TASK, f"model {name!r} is a {model.task} model; {task} models: {same_task}"
        )

    def not_ready_error(self) -> NotReady:
        if self.phase == FAILED:
            return NotReady(
                ErrorCode.NOT_READY,
                f"the service failed to load its models: {self.error}",
                retry_after_s=None,
            )
        message = {LOADING: "the models are still loading", DRAINING: "the service is shutting down"}[
            self.phase
        ]
        return NotReady(ErrorCode.NOT_READY, message)

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


__all__ = ["ServiceState", "LOADING", "READY", "FAILED", "DRAINING"]
