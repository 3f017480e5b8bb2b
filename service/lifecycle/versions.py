"""The version table: every model version the service knows, its state, and which one a request gets.

States are Triton's: READY (serving), LOADING, UNLOADING (draining: finishing what it holds, taking
nothing new) and UNAVAILABLE (not loaded, with the reason: never loaded, unloaded, a failed load or
check, or an incomplete directory). A request leases a READY version (`lease`): the newest unless
it pins one, and holds it until its answer is back, so a version is closed only once nothing holds
it. A load (`apply`) brings a model to its version policy:

1. every version to load is loaded *beside* the serving ones, in a thread (the loader warms it up
   and checks it against its export's recorded check); a failure leaves it UNAVAILABLE with the
   reason and touches nothing else, and so does a load still going at its deadline
   (`load_timeout_s`), which is abandoned: its runs are stopped (`Abandon`), its thread a daemon
   that no exit waits for, as is a load still going when the service stops;
2. only a version that passed starts its batcher and turns READY: from then on new requests
   without a version go to the newest READY one;
3. versions the policy no longer selects (or whose directory is gone) are drained and closed:
   UNLOADING until their leases end (bounded by the drain timeout), then UNAVAILABLE "unloaded".
   While no selected version could be loaded, the serving ones stay (automatic rollback).

Loads of one model run one at a time (a lock per model); requests never wait for a load, and a
repository call for one model never waits for another model's load (the poller applies the
models it found changed one after the other). The table is generic over what it serves
(anything with a task and a `DynamicBatcher`), so that its properties can be tested with plain
functions as models. A model's model-level problems from the last scan (two directories claim its
name, an unreadable policy file, a stray directory) are index entries without a version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar, cast

from contract.errors import ErrorCode, InvalidInput, ModelNotFound, NotReady
from contract.messages import echo
from contract.repository import VersionPolicy
from contract.scan import Fingerprint, ModelSource, VersionSource
from service.engine.batcher import RowQueue
from service.engine.runtime import Abandon
from service.telemetry.metrics import LifecycleMetrics

log = logging.getLogger(__name__)


class VersionState(StrEnum):
    """A version's state, Triton's names (what the repository index answers)."""

    READY = "READY"  # serving
    LOADING = "LOADING"  # loading, warming up and checking
    UNLOADING = "UNLOADING"  # draining: finishing what it holds, taking nothing new
    UNAVAILABLE = "UNAVAILABLE"  # not loaded, with the reason


READY, LOADING, UNLOADING, UNAVAILABLE = VersionState
NOT_LOADED, UNLOADED = "not loaded", "unloaded"
# How long shutdown waits for a load it abandoned to end its thread.
ABANDONED_JOIN_S = 2.0


class Servable(Protocol):
    task: str
    batcher: RowQueue[Any, Any]


S = TypeVar("S", bound=Servable)


@dataclass(eq=False)
class Loaded(Generic[S]):
    """One loaded session of a version and the requests holding it."""

    served: S
    leases: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Version(Generic[S]):
    model: str
    number: int
    state: VersionState = VersionState.UNAVAILABLE
    reason: str = NOT_LOADED
    loaded: Loaded[S] | None = None
    failed: bool = False  # the last load or check of `fingerprint` failed: not retried by itself
    fingerprint: Fingerprint = ()


@dataclass(eq=False)
class ModelRecord(Generic[S]):
    name: str
    versions: dict[int, Version[S]] = field(default_factory=dict)
    policy: VersionPolicy | None = None  # from a load call's config; wins over the policy file
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    problems: tuple[str, ...] = ()  # model-level, from the last scan (module docstring)


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


@dataclass(eq=False)
class VersionTable(Generic[S]):
    """All versions of all models, their states, leases and loads (see the module docstring)."""

    loader: Callable[[VersionSource, Abandon], S]
    _: KW_ONLY
    policy: VersionPolicy
    drain_timeout_s: float
    observer: LifecycleMetrics
    max_loaded: int | None = None
    load_timeout_s: float | None = None  # None: a load may take as long as it takes
    models: dict[str, ModelRecord[S]] = field(default_factory=dict, init=False)

    def newest_ready(self, name: str) -> Version[S] | None:
        """The newest READY version of `name` (what a request that names no version gets), or None."""
        record = self.models.get(name)
        ready = [v for v in (record.versions.values() if record else ()) if v.state == READY]
        return max(ready, key=lambda v: v.number) if ready else None

    def ready_versions(self, name: str) -> list[int]:
        record = self.models.get(name)
        return sorted(v.number for v in record.versions.values() if v.state == READY) if record else []

    def require(self, name: str, version: int | None = None) -> ModelRecord[S]:
        """The record of a model the repository has (with `version`, if given); else ModelNotFound."""
        record = self.models.get(name)
        if record is None or not record.versions:
            served = sorted(n for n in self.models if self.newest_ready(n) is not None)
            why = f" ({'; '.join(record.problems)})" if record is not None and record.problems else ""
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND, f"model {echo(name)} is not served{why}; served models: {served}"
            )
        if version is not None and version not in record.versions:
            raise ModelNotFound(
                ErrorCode.VERSION_NOT_FOUND,
                f"model {echo(name)} has no version {echo(version)}; versions: "
                f"{[str(v) for v in sorted(record.versions)]}",
            )
        return record

    def pick(self, name: str, version: int | None = None) -> Version[S]:
        """The READY version a request gets; ModelNotFound or NotReady say why there is none."""
        record = self.require(name, version)
        if version is not None:
            chosen = record.versions[version]
            if chosen.state != READY:
                raise _unavailable(
                    f"version {version} of model {echo(name)} is {chosen.state} ({chosen.reason})", chosen
                )
            return chosen
        newest = self.newest_ready(name)
        if newest is not None:
            return newest
        states = "; ".join(f"{v.number}: {v.state} ({v.reason})" for v in record.versions.values())
        if all(v.state == UNAVAILABLE and not v.failed for v in record.versions.values()):
            raise ModelNotFound(
                ErrorCode.MODEL_NOT_FOUND, f"model {echo(name)} is not loaded (versions {states})"
            )
        busy = next((v for v in record.versions.values() if v.state != UNAVAILABLE), None)
        raise _unavailable(f"model {echo(name)} has no READY version: {states}", busy)

    @contextmanager
    def lease(self, name: str, version: int | None = None) -> Iterator[tuple[int, S]]:
        """Hold the READY version `pick` chooses (and its model) for one request; it is not closed
        while held."""
        chosen = self.pick(name, version)
        loaded = chosen.loaded
        assert loaded is not None
        loaded.leases += 1
        loaded.idle.clear()
        self.observer.leased(chosen.model, chosen.number)
        try:
            yield chosen.number, loaded.served
        finally:
            loaded.leases -= 1
            if loaded.leases == 0:
                loaded.idle.set()

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every known version with its state and (unless READY) the reason; each model-level
        problem as an UNAVAILABLE entry without a version."""
        entries = []
        for record in self.models.values():
            if not ready_only:
                entries += [IndexEntry(record.name, "", UNAVAILABLE, problem) for problem in record.problems]
            entries += [
                IndexEntry(record.name, str(v.number), v.state, "" if v.state == READY else v.reason)
                for v in sorted(record.versions.values(), key=lambda v: v.number)
                if not ready_only or v.state == READY
            ]
        return entries

    def policy_of(self, name: str, source: ModelSource | None = None) -> VersionPolicy:
        record = self.models.get(name)
        return (record.policy if record else None) or (source.policy if source else None) or self.policy

    def register(self, source: ModelSource) -> None:
        """Know a model and its versions without loading any (explicit mode's other models)."""
        record = self.models.setdefault(source.name, ModelRecord(source.name))
        self._record_versions(record, source)

    def note(self, source: ModelSource) -> None:
        """Record the problems of a model that cannot be applied as it is on disk (`source.problem`):
        listed in the index, while its versions stay as they are (nothing loads or unloads)."""
        self.models.setdefault(source.name, ModelRecord(source.name)).problems = source.problems()

    async def apply(
        self, source: ModelSource, policy: VersionPolicy | None = None, *, retry: bool = False
    ) -> dict[int, str]:
        """Bring `source`'s model to its version policy (steps in the module docstring); returns the
        reasons of the versions that failed. `retry`: load failed versions again even when their
        directory did not change (an explicit load call). Raises InvalidInput (nothing changed)
        when the load would hold more than `max_loaded` versions."""
        record = self.models.setdefault(source.name, ModelRecord(source.name))
        async with record.lock:
            if policy is not None:
                record.policy = policy
            self._record_versions(record, source)
            wanted = self.policy_of(source.name, source).select(source.complete_versions())
            to_load = [
                v for v in sorted(wanted) if self._needs_load(record.versions[v], source.versions[v], retry)
            ]
            held = sum(1 for v in record.versions.values() if v.loaded is not None)
            if to_load and self.max_loaded is not None and held + len(to_load) > self.max_loaded:
                self.observer.refused(source.name, ErrorCode.TOO_MANY_VERSIONS)
                raise InvalidInput(
                    ErrorCode.TOO_MANY_VERSIONS,
                    f"loading versions {to_load} of model {source.name!r} beside the {held} loaded would "
                    f"exceed GMLP_MAX_LOADED_VERSIONS={self.max_loaded}; nothing was loaded or unloaded",
                )
            failures: dict[int, str] = {}
            for number in to_load:
                reason = await self._load(record.versions[number], source.versions[number], record)
                if reason is not None:
                    failures[number] = reason
            # Unwanted versions go once a wanted one serves; removed ones always.
            settled = any(record.versions[v].state == READY for v in wanted)
            retire = [
                v
                for v in record.versions.values()
                if v.loaded is not None
                and (v.number not in source.versions or (settled and v.number not in wanted))
            ]
            await asyncio.gather(*(self._retire(v) for v in retire))
            for number in [n for n in record.versions if n not in source.versions]:
                version = record.versions.pop(number)
                self.observer.state_changed(source.name, number, version.state, None)
            if not record.versions and not record.problems:
                del self.models[source.name]
            return failures

    async def unload(self, name: str) -> None:
        """Drain and close every loaded version of `name` (ModelNotFound when unknown)."""
        record = self.models.get(name)
        if record is None:
            raise ModelNotFound(ErrorCode.MODEL_NOT_FOUND, f"model {echo(name)} is not in the repository")
        async with record.lock:
            await asyncio.gather(*(self._retire(v) for v in record.versions.values() if v.loaded is not None))

    async def close(self) -> None:
        """Shutdown: drain and close everything loaded."""
        await asyncio.gather(*(self.unload(name) for name in list(self.models)), return_exceptions=True)

    def _record_versions(self, record: ModelRecord[S], source: ModelSource) -> None:
        record.problems = source.problems()
        for number, on_disk in source.versions.items():
            version = record.versions.get(number)
            if version is None:
                version = record.versions[number] = Version(source.name, number)
                self.observer.state_changed(source.name, number, None, UNAVAILABLE)
            if version.loaded is None and version.state == UNAVAILABLE and not version.failed:
                version.reason = on_disk.problem or (UNLOADED if version.reason == UNLOADED else NOT_LOADED)

    @staticmethod
    def _needs_load(version: Version[S], on_disk: VersionSource, retry: bool) -> bool:
        changed = version.fingerprint != on_disk.fingerprint
        if version.loaded is not None:
            return changed and version.state == READY
        return retry or changed or not version.failed

    def _set(self, version: Version[S], state: VersionState, reason: str) -> None:
        old = version.state
        version.state, version.reason = state, reason
        if old != state:
            self.observer.state_changed(version.model, version.number, old, state)
            why = f" ({reason})" if reason else ""
            log.info("model %s version %d: %s -> %s%s", version.model, version.number, old, state, why)

    async def _load(self, version: Version[S], on_disk: VersionSource, record: ModelRecord[S]) -> str | None:
        """Load, warm up and check one version beside the serving ones; None when it is READY."""
        reloading = version.loaded is not None
        if not reloading:
            self._set(version, LOADING, "loading, warming up and checking")
        version.fingerprint = on_disk.fingerprint
        try:
            served = await self._load_in_thread(on_disk, f"gmlp-load-{version.model}-{version.number}")
            for other in record.versions.values():
                task = other.loaded.served.task if other.loaded is not None else served.task
                if other.number != version.number and task != served.task:
                    raise ValueError(
                        f"it is a {served.task} model but version {other.number} of {record.name!r} is a "
                        f"{task} model; a model keeps its task across versions"
                    )
        except Exception as exc:  # a broken version must never take the service down
            reason = str(exc) or type(exc).__name__
            version.failed = True
            self.observer.refused(version.model, ErrorCode.LOAD_FAILED)
            log.warning("model %s version %d refused: %s", version.model, version.number, reason)
            if reloading:
                version.reason = f"reload failed, still serving the earlier load: {reason}"
            else:
                self._set(version, UNAVAILABLE, f"load failed: {reason}")
            return reason
        served.batcher.start()
        old, version.loaded, version.failed = version.loaded, Loaded(served), False
        version.loaded.idle.set()
        self.observer.loaded(version.model)
        self._set(version, READY, "")
        if old is not None:
            await self._drain(version.model, old)
        return None

    async def _load_in_thread(self, on_disk: VersionSource, name: str) -> S:
        """The loader's result, from a daemon thread of its own; abandoned (its runs stopped) once
        `load_timeout_s` has passed, or when the awaiting task is cancelled (shutdown)."""
        loop, abandon = asyncio.get_running_loop(), Abandon()
        done: asyncio.Future[S] = loop.create_future()

        def settle(result: S | None, error: BaseException | None) -> None:
            if done.done():  # the awaiting task gave up on it
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(cast(S, result))

        def body() -> None:
            try:
                result, error = self.loader(on_disk, abandon), None
            except BaseException as exc:  # handed to the awaiting task, whatever it is
                result, error = None, exc
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, result, error)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.load_timeout_s)
        except TimeoutError:
            abandon.abandon()
            done.cancel()  # what the thread ends with is nobody's any more
            raise TimeoutError(
                f"the load did not finish within {self.load_timeout_s:g} s (load_timeout_s): abandoned"
            ) from None
        except asyncio.CancelledError:
            abandon.abandon()
            done.cancel()
            # Shutdown: the stopped run ends its thread at once, before the process does (bounded:
            # a thread stuck outside any run stays the daemon that no exit waits for).
            await asyncio.to_thread(thread.join, ABANDONED_JOIN_S)
            raise

    async def _retire(self, version: Version[S]) -> None:
        loaded = version.loaded
        if loaded is None:
            return
        self._set(version, UNLOADING, "draining: finishing the requests it holds")
        await self._drain(version.model, loaded)
        if version.loaded is loaded:
            version.loaded = None
            self._set(version, UNAVAILABLE, UNLOADED)
            self.observer.closed(version.model, version.number)

    async def _drain(self, model: str, loaded: Loaded[S]) -> None:
        """Wait (bounded) until no request holds `loaded`, then close its batcher."""
        try:
            await asyncio.wait_for(loaded.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            log.warning("model %s: %d requests still held after the drain timeout", model, loaded.leases)
        await loaded.served.batcher.close(self.drain_timeout_s)
        self.observer.unloaded(model)


def _unavailable(message: str, version: Version[Any] | None) -> NotReady:
    """Retry soon while a version is on its way; a failed one needs an operator (no Retry-After)."""
    transient = version is not None and version.state in (LOADING, UNLOADING)
    return NotReady(ErrorCode.VERSION_UNAVAILABLE, message, retry_after_s=1 if transient else None)
