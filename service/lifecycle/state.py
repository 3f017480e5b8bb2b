"""The service's domain state: the version table of its models, the per-task defaults and the phase.

Models load in the background after the server starts listening, so that liveness answers at once
and readiness turns true only when the start-up models are loaded *and* have run their warm-up
batches (the first ORT runs allocate memory and are slow; a load balancer should not send traffic
before). Which models load at start-up, and what happens later, is the model control mode
(`GMLP_MODEL_CONTROL`): `none` loads every model once (any failure fails the service, as a
misconfigured repository should), `poll` also rescans the repository and loads or unloads what
changed, `explicit` loads only `GMLP_LOAD_MODEL` and then what the repository API asks for. Each
version is loaded, warmed up and checked by `service.lifecycle.versions.VersionTable`. On shutdown,
readiness turns false first, then every version drains (bounded by `drain_timeout_s`) and closes.

Nothing here knows a transport: refusals are `contract.errors` errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TypeVar

from contract.errors import ErrorCode, InvalidInput, ModelNotFound, NotReady
from contract.messages import echo
from contract.repository import PolicyError, VersionPolicy, policy_from_config
from contract.scan import ModelSource, VersionSource, require_sources, scan
from contract.spec import SpecError
from service.engine import request_context
from service.engine.runtime import Abandon, resolve_device
from service.lifecycle import mirror
from service.lifecycle.poller import RepositoryPoller, ScanReport
from service.lifecycle.versions import IndexEntry, VersionTable
from service.settings import ServiceSettings
from service.tasks.pipeline import Pipeline
from service.tasks.registry import PIPELINES, load_pipeline
from service.telemetry.metrics import LifecycleMetrics, ServiceMetrics

log = logging.getLogger(__name__)

P = TypeVar("P", bound=Pipeline)


class Phase(StrEnum):
    """Where the service is in its life (what the health probes answer): loading its start-up
    models, ready, failed to load them (restart it), or draining on shutdown."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"


class ServiceState:
    """The running service as every transport sees it: settings, metrics, the version table, the
    default model per task, and the `Phase`.

    One instance per app, shared by the HTTP routes and the gRPC server, so that both resolve the
    same models, feed the same batchers and turn ready and drain together; a request resolves its
    model once, at the transport (`lease`, or `loaded` for metadata), and hands it down.
    """

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        metrics.request_timeout.set(settings.request_timeout_s)
        self._defaults: dict[str, str | None] | None = None  # None: to be worked out again
        self._table: VersionTable[Pipeline] = VersionTable(
            self._load_version,
            policy=VersionPolicy.parse(settings.version_policy),
            drain_timeout_s=settings.drain_timeout_s,
            max_loaded=settings.max_loaded_versions,
            observer=LifecycleMetrics(metrics, self._versions_changed),
            load_timeout_s=settings.load_timeout_s,
        )
        self.phase: Phase = Phase.LOADING
        self.error: str | None = None
        self._device = "cpu"
        self.report = ScanReport(metrics)
        self._poller = RepositoryPoller(
            self._table,
            settings.model_repository,
            settings.repository_poll_s,
            metrics,
            report=self.report,
            after_scan=self._update_ready_gauges,
        )

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    # What the transports read of the version table: asked here, so that the table's shape stays
    # the lifecycle's own.

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every known version with its state and, unless READY, the reason (the repository index,
        /models' versions, the failed loads readiness names)."""
        return self._table.index(ready_only)

    def known_versions(self, name: str) -> list[int] | None:
        """The versions of model `name` the service knows, in any state; None for a model it does
        not know at all."""
        record = self._table.models.get(name)
        return None if record is None else sorted(record.versions)

    def ready_versions(self, name: str) -> list[int]:
        return self._table.ready_versions(name)

    def policy_of(self, name: str) -> VersionPolicy:
        """The version policy model `name` is served under (its own, else the service's)."""
        return self._table.policy_of(name)

    def snapshot(self, describe: Callable[[Pipeline], mirror.Served]) -> mirror.Snapshot:
        """The lifecycle as a value (`service.lifecycle.mirror`), each loaded model described by
        `describe`: what an engine process tells its front-ends."""
        return mirror.Snapshot(self.phase.value, self.error, mirror.take(self._table, describe))

    def restore(self, snapshot: mirror.Snapshot, built: Callable[[mirror.Served], Pipeline | None]) -> None:
        """Serve what `snapshot` says, each loaded model as `built` returns it: a front-end's copy
        of its engine's lifecycle, which the engine changes, never this process."""
        mirror.restore(self._table, snapshot.models, built)
        self.phase, self.error = Phase(snapshot.phase), snapshot.error
        self._versions_changed()

    def newest_ready(self) -> dict[str, Pipeline]:
        """The pipeline of the newest READY version of every model that has one."""
        newest = {name: self._table.newest_ready(name) for name in self._table.models}
        return {name: v.loaded.served for name, v in newest.items() if v is not None and v.loaded}

    @property
    def defaults(self) -> dict[str, str | None]:
        """The model a task route uses when the request names none: the configured one, else the
        first served model of the task in repository order. Read by every request that names no
        model, so worked out once per change of the version table, not per request."""
        if self._defaults is None:
            served = self.newest_ready()
            self._defaults = {
                task: configured or next((n for n, m in served.items() if m.task == task), None)
                for task, configured in self._configured_defaults().items()
            }
        return self._defaults

    def _versions_changed(self) -> None:
        """A version changed state (or came or went): the defaults are worked out again when next read."""
        self._defaults = None

    def _configured_defaults(self) -> dict[str, str | None]:
        return {task: getattr(self.settings, kind.default_setting) for task, kind in PIPELINES.items()}

    def _load_version(self, source: VersionSource, abandon: Abandon) -> Pipeline:
        """The table's loader (blocking, in a thread): session, warm-up, recorded check."""
        assert source.spec is not None
        version = str(source.version)
        return load_pipeline(source.spec, self.settings, self._device, self.metrics, version, abandon)

    async def load(self) -> None:
        """Load the start-up models of the control mode; then, in poll mode, start watching."""
        settings = self.settings
        try:
            self._device = resolve_device(settings.device)
            explicit = settings.model_control == "explicit"
            sources = await asyncio.to_thread(
                scan if explicit else require_sources, settings.model_repository
            )
            self.report(sources)
            names = settings.startup_models if explicit else list(sources)
            unknown = [n for n in names if n not in sources]
            if unknown:
                raise SpecError(
                    f"--load-model names {unknown}, not in {settings.model_repository}: {list(sources)}"
                )
            strict = settings.model_control == "none"  # every model must load
            for name, source in sources.items():
                if source.problem is not None:
                    if strict:
                        raise SpecError(f"model {name}: {source.problem}")
                    self._table.note(source)  # listed with its reason; the other models load
                elif name not in names:
                    self._table.register(source)
                else:
                    failures = await self._table.apply(source)
                    if strict and (failures or self._table.newest_ready(name) is None):
                        raise SpecError(f"model {name}: {failures or _why_not(source)}")
            served = self.newest_ready()
            for task, default in self._configured_defaults().items():
                # Strict only: in the other modes models come and go, a default is resolved per request.
                if strict and default is not None and (default not in served or served[default].task != task):
                    raise ValueError(f"default {task} model {echo(default)} is not a served {task} model")
        except Exception as exc:
            self.phase, self.error = Phase.FAILED, f"{type(exc).__name__}: {exc}"
            log.exception("loading the model repository failed; the service will not become ready")
            return
        self._update_ready_gauges()
        self.phase = Phase.READY
        log.info(
            "ready (model control %s): %s",
            settings.model_control,
            ", ".join(
                f"{m.name} v{m.version} ({m.task}, {m.variant}, {m.runtime.provider})"
                for m in self.newest_ready().values()
            )
            or "no model loaded",
        )
        if settings.model_control == "poll":
            self._poller.start()

    def _update_ready_gauges(self) -> None:
        for name in self._table.models:
            newest = self._table.newest_ready(name)
            if newest is not None and newest.loaded is not None:
                newest.loaded.served.ready = True
            self.metrics.model_ready.labels(name).set(1 if newest is not None else 0)

    async def load_model(self, name: str, config: str | None = None) -> None:
        """Load (or reload) `name` per its version policy (`config`: a JSON model configuration whose
        `version_policy` replaces the model's); InvalidInput when refused or nothing loaded."""
        self._require_explicit("load")
        policy = None
        if config is not None:
            try:
                policy = policy_from_config(config)
            except PolicyError as exc:
                raise InvalidInput(ErrorCode.INVALID_VERSION_POLICY, str(exc)) from None
        sources = await asyncio.to_thread(scan, self.settings.model_repository)
        self.report(sources)
        source = sources.get(name)
        if source is None:
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND,
                f"model {echo(name)} is not in the repository {self.settings.model_repository}; "
                f"models: {list(sources)}",
            )
        if source.problem is not None:
            self._table.note(source)
            raise InvalidInput(ErrorCode.LOAD_FAILED, f"model {name!r} cannot be loaded: {source.problem}")
        failures = await self._table.apply(source, policy, retry=True)
        self._update_ready_gauges()
        wanted = self._table.policy_of(name, source).select(source.complete_versions())
        if not wanted or not any(v in self._table.ready_versions(name) for v in wanted):
            problems = failures or {v: s.problem for v, s in source.versions.items() if s.problem}
            raise InvalidInput(
                ErrorCode.LOAD_FAILED,
                f"failed to load model {echo(name)} (policy {self._table.policy_of(name, source)}): "
                + ("; ".join(f"version {v}: {r}" for v, r in problems.items()) or "no complete version"),
            )

    async def unload_model(self, name: str) -> None:
        """Drain and close every version of `name`; afterwards requests for it answer 404."""
        self._require_explicit("unload")
        await self._table.unload(name)
        self._update_ready_gauges()

    def _require_explicit(self, call: str) -> None:
        if self.settings.model_control != "explicit":
            raise InvalidInput(
                ErrorCode.MODEL_CONTROL_DISABLED,
                f"the repository {call} call needs GMLP_MODEL_CONTROL=explicit (this server runs "
                f"{self.settings.model_control!r})",
            )

    @contextmanager
    def lease(self, name: str | None, version: int | None, *, kind: type[P]) -> Iterator[P]:
        """Lease the model a request runs for the request's lifetime: `name` (None: the default of
        `kind`'s task) at `version` (None: `newest_ready`), a `kind` pipeline (`Pipeline`: any
        task, named by the request). Refused while the service is not ready, and with what else
        is available."""
        if not self.ready:
            raise self.not_ready_error()
        task = kind.task
        if name is None:
            name = self.defaults.get(task)
            if name is None:
                raise ModelNotFound(ErrorCode.NO_MODEL, f"no {task} model is served")
        if name not in self._table.models:
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND,
                f"model {echo(name)} is not served; {task or 'served'} models: {self._of_task(task)}",
            )
        with self._table.lease(name, version) as (_, model):
            if not isinstance(model, kind):
                raise InvalidInput(
                    ErrorCode.WRONG_TASK,
                    f"model {echo(name)} is a {model.task} model; {task} models: {self._of_task(task)}",
                )
            request_context.note_model(model.name)
            yield model

    def loaded(self, name: str, version: int | None = None) -> Pipeline:
        """The READY pipeline of `name` (`version`, else `newest_ready`) for a metadata request:
        answered for the models loaded so far, also before the service is ready; not leased."""
        chosen = self._table.pick(name, version)
        assert chosen.loaded is not None
        request_context.note_model(name)
        return chosen.loaded.served

    def version_ready(self, name: str, version: int | None = None) -> bool:
        """Whether `version` (None: any version) of `name` takes requests; a model or version the
        repository does not know is ModelNotFound."""
        self._table.require(name, version)
        ready = self._table.ready_versions(name)
        return self.ready and (version in ready if version is not None else bool(ready))

    def _of_task(self, task: str) -> list[str]:
        """Served models of `task`, for refusals (listed only then, off the per-request path)."""
        return sorted(n for n, m in self.newest_ready().items() if m.task == task or not task)

    def not_ready_error(self) -> NotReady:
        if self.phase is Phase.FAILED:
            message = f"the service failed to load its models: {self.error}"
            return NotReady(ErrorCode.NOT_READY, message, retry_after_s=None)
        loading = self.phase is Phase.LOADING
        return NotReady(
            ErrorCode.NOT_READY, "the models are still loading" if loading else "the service is shutting down"
        )

    async def shutdown(self) -> None:
        """Stop watching and accepting, finish queued and running requests, release the sessions."""
        self.phase = Phase.DRAINING
        await self._poller.stop()
        count = len(self.newest_ready())
        await self._table.close()
        for name in self._table.models:
            self.metrics.model_ready.labels(name).set(0)
        log.info("drained and closed %d models", count)


def _why_not(source: ModelSource) -> str:
    """Why a model has no version to serve, from what its directory holds."""
    problems = [
        *source.problems(),
        *(f"version {v}: {s.problem}" for v, s in source.versions.items() if s.problem),
    ]
    return "; ".join(problems) or "no version selected by the version policy"
