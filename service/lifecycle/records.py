"""What the version table keeps: each model's record, its versions' states and loaded sessions,
the index entries it lists, and the observer it reports to (`service.lifecycle.versions` has the table).

A model's record also keeps its model-level problems from the last scan (`problems`: two
directories claim its name, an unreadable policy file, a directory inside it that is not a
version): the index lists each as an UNAVAILABLE entry with an empty version and the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from contract.repository import VersionPolicy
from contract.scan import Fingerprint
from service.engine.batcher import DynamicBatcher


class VersionState(StrEnum):
    """A version's state, Triton's names (what the repository index answers)."""

    READY = "READY"  # serving
    LOADING = "LOADING"  # loading, warming up and checking
    UNLOADING = "UNLOADING"  # draining: finishing what it holds, taking nothing new
    UNAVAILABLE = "UNAVAILABLE"  # not loaded, with the reason


NOT_LOADED, UNLOADED = "not loaded", "unloaded"


class Servable(Protocol):
    task: str
    batcher: DynamicBatcher[Any, Any]


S = TypeVar("S", bound=Servable)


class LifecycleObserver(Protocol):
    """What the table reports, for metrics (`service.telemetry.metrics`); every report is a no-op
    here (`NullObserver`)."""

    def state_changed(
        self, model: str, version: int, old: VersionState | None, new: VersionState | None
    ) -> None:
        return

    def loaded(self, model: str) -> None:
        return

    def unloaded(self, model: str) -> None:
        return

    def closed(self, model: str, version: int) -> None:
        return

    def refused(self, model: str, reason: str) -> None:
        return

    def leased(self, model: str, version: int) -> None:
        return


class NullObserver(LifecycleObserver):
    """The observer of a table nobody watches."""


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
