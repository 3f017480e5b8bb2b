"""The version table as a value: what the engine process tells its front-end processes.

The engine owns the table (loads, drains, polls, the repository calls); each front-end serves
from a copy of it, taken again whenever it changes: every model and version with its state and
reason, and for each loaded one what a front-end needs to check, prepare and describe its requests
(`Served`: the spec, the variant, the graph's names and shapes, the batching). A front-end builds
its own light model from that once per load (its transform or tokenizer, no session) and hands its
rows to the engine. So every transport reads the same index, errors and defaults in every process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from contract.repository import VersionPolicy
from contract.scan import Fingerprint
from contract.spec import ModelSpec
from service.engine.runtime import RuntimeFacts
from service.lifecycle.versions import Loaded, ModelRecord, Servable, Version, VersionState, VersionTable

S = TypeVar("S", bound=Servable)


@dataclass(frozen=True)
class Batching:
    """A model's batching settings, as its description shows them."""

    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    always_wait: bool
    instances: int


@dataclass(frozen=True)
class Served:
    """One loaded version as a front-end serves it: `load` tells loads of the same version apart
    (a reload after its files changed)."""

    load: int
    task: str
    spec: ModelSpec
    version: str
    variant: str
    runtime: RuntimeFacts
    batching: Batching
    ready: bool


@dataclass(frozen=True)
class VersionView:
    number: int
    state: VersionState
    reason: str
    failed: bool
    fingerprint: Fingerprint
    served: Served | None


@dataclass(frozen=True)
class ModelView:
    name: str
    policy: VersionPolicy | None
    problems: tuple[str, ...]
    versions: tuple[VersionView, ...]


@dataclass(frozen=True)
class Snapshot:
    """The whole lifecycle at one moment: the phase (and why it failed) and every model."""

    phase: str
    error: str | None
    models: tuple[ModelView, ...]

    def served(self) -> list[Served]:
        return [v.served for m in self.models for v in m.versions if v.served is not None]


def take(table: VersionTable[S], describe: Callable[[S], Served]) -> tuple[ModelView, ...]:
    """Every model of `table`, each loaded version described by `describe`."""
    return tuple(
        ModelView(
            record.name,
            record.policy,
            record.problems,
            tuple(
                VersionView(
                    v.number,
                    v.state,
                    v.reason,
                    v.failed,
                    v.fingerprint,
                    None if v.loaded is None else describe(v.loaded.served),
                )
                for v in sorted(record.versions.values(), key=lambda v: v.number)
            ),
        )
        for record in table.models.values()
    )


def restore(
    table: VersionTable[S], models: tuple[ModelView, ...], built: Callable[[Served], S | None]
) -> None:
    """Make `table` hold `models`: each loaded version as the model `built` returns for it
    (None: this process could not build it; the version is then not served here)."""
    records: dict[str, ModelRecord[S]] = {}
    for model in models:
        record = ModelRecord[S](model.name, policy=model.policy, problems=model.problems)
        for view in model.versions:
            served = None if view.served is None else built(view.served)
            state, reason = view.state, view.reason
            if view.served is not None and served is None:
                state, reason = VersionState.UNAVAILABLE, "this front-end could not prepare it; see its log"
            record.versions[view.number] = Version(
                model.name,
                view.number,
                state,
                reason,
                None if served is None else Loaded(served),
                view.failed,
                view.fingerprint,
            )
        records[model.name] = record
    table.models = records
