"""Properties of the version table under random event sequences (hypothesis).

Random scripts of repository changes (a version deployed, broken or not; a version removed),
loads with random version policies (what a poll or a load call does), unloads, and requests (for
the newest version or a pinned one) that run concurrently with whatever follows them. The models
are plain functions behind real `DynamicBatcher`s. Whatever the interleaving:

- a request is answered by a version that was READY when it was leased, and by that version's
  own model; or it is refused with a documented error (ModelNotFound, NotReady), never another;
- no batch ever runs on a closed model, and no model is closed while it runs a batch, has
  requests queued, or is held by a request;
- a failed load changes nothing else: a READY version stays READY unless the policy moved on to
  a version that did load;
- at the end every loaded version is READY with a running batcher and every other one is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.errors import InvalidInput, ModelNotFound, NotReady
from contract.repository import VersionPolicy
from contract.scan import ModelSource, VersionSource
from contract.spec import ModelSpec
from service.engine.batcher import DynamicBatcher
from service.engine.runtime import Abandon
from service.lifecycle.versions import VersionState, VersionTable
from service.telemetry.metrics import LifecycleMetrics, ServiceMetrics

pytestmark = pytest.mark.timeout(300)

NAME = "m"


class CheckedBatcher(DynamicBatcher[int, tuple[int, int]]):
    """A real batcher that records a close while it still had work."""

    def __init__(self, model: FakeModel) -> None:
        super().__init__(model.run, max_batch_size=4, max_queue_delay_s=0.0, max_queue_size=64, name="m")
        self.model = model

    async def close(self, timeout: float | None = None) -> None:
        if self.running_batches or self.queue or self.model.holders():
            self.model.violations.append(f"version {self.model.version} closed while busy")
        self.model.closed = True
        await super().close(timeout)


@dataclass(eq=False)
class FakeModel:
    version: int
    violations: list[str]
    holders: Any = None  # () -> leases on this model, set by the table's record
    task: str = "t"
    closed: bool = False
    batcher: CheckedBatcher = field(init=False)

    def __post_init__(self) -> None:
        self.batcher = CheckedBatcher(self)

    def run(self, items: list[int]) -> list[tuple[int, int]]:
        if self.closed:
            self.violations.append(f"a batch ran on closed version {self.version}")
        time.sleep(0.001)
        return [(self.version, item) for item in items]


deploy = st.tuples(st.just("deploy"), st.integers(1, 4), st.booleans())
remove = st.tuples(st.just("remove"), st.integers(1, 4))
policies = st.sampled_from(["latest:1", "latest:2", "all", "specific:1", "specific:2,3", "specific:4"])
apply = st.tuples(st.just("apply"), policies)
unload = st.tuples(st.just("unload"))
request = st.tuples(
    st.just("request"),
    st.one_of(st.none(), st.integers(1, 5)),
    st.integers(1, 3),
    st.sampled_from([0, 0.002, 0.01]),
)
events = st.lists(st.one_of(deploy, remove, apply, unload, request, request), min_size=1, max_size=25)


async def scenario(script: list[tuple[Any, ...]], max_loaded: int | None) -> None:
    violations: list[str] = []
    models: list[FakeModel] = []
    on_disk: dict[int, tuple[bool, int]] = {}  # version -> (broken, deployment number)
    deployments = itertools.count()

    def loader(source: VersionSource, abandon: Abandon) -> FakeModel:
        broken, _ = on_disk.get(source.version, (True, 0))
        time.sleep(0.002)
        if broken:
            raise ValueError(f"version {source.version} is broken")
        model = FakeModel(source.version, violations)
        model.holders = lambda: held.get(model, 0)
        models.append(model)
        return model

    table: VersionTable[Any] = VersionTable(
        loader,
        policy=VersionPolicy.parse("latest:1"),
        drain_timeout_s=10.0,
        observer=LifecycleMetrics(ServiceMetrics(8), lambda: None),
        max_loaded=max_loaded,
    )

    held: dict[FakeModel, int] = {}  # the requests inside a lease, counted here, not by the table

    def source() -> ModelSource:
        spec = ModelSpec(NAME, "t", Path("/nonexistent"), {})
        return ModelSource(
            NAME,
            {
                v: VersionSource(NAME, v, Path(f"/nonexistent/{v}"), spec, None, (("x", n, 0),))
                for v, (_, n) in on_disk.items()
            },
        )

    async def one_request(version: int | None, item: int, hold_s: float) -> None:
        try:
            with table.lease(NAME, version) as (number, model):
                held[model] = held.get(model, 0) + 1
                try:
                    state = table.models[NAME].versions[number].state
                    if state != VersionState.READY or model.closed:
                        violations.append(f"leased version {number} in state {state}")
                    leased_state_ok = version is None or number == version
                    await asyncio.sleep(hold_s)  # reading the body, decoding: the lease is held meanwhile
                    answer = (await model.batcher.submit(item)).output
                finally:
                    held[model] -= 1
            if answer != (number, item) or not leased_state_ok:
                violations.append(f"request for {version} answered {answer} by version {number}")
        except (ModelNotFound, NotReady):
            pass
        except Exception as exc:
            violations.append(f"request for {version}: undocumented {exc!r}")

    pending: list[asyncio.Task[None]] = []
    items = itertools.count()
    for event in script:
        kind = event[0]
        if kind == "deploy":
            on_disk[event[1]] = (event[2], next(deployments))
        elif kind == "remove":
            on_disk.pop(event[1], None)
        elif kind == "apply":
            ready_before = set(table.ready_versions(NAME))
            try:
                failures = await table.apply(source(), VersionPolicy.parse(event[1]))
            except InvalidInput:
                if set(table.ready_versions(NAME)) != ready_before:
                    violations.append("a refused load changed the READY versions")
                continue
            ready_after = set(table.ready_versions(NAME))
            wanted = VersionPolicy.parse(event[1]).select(on_disk)
            lost = (ready_before & set(on_disk)) - ready_after
            if not (ready_after & wanted) and lost:
                violations.append(f"a load that served nothing it wanted unloaded {lost} ({failures})")
        elif kind == "unload":
            if NAME in table.models:
                await table.unload(NAME)
        else:
            pending += [
                asyncio.create_task(one_request(event[1], next(items), event[3])) for _ in range(event[2])
            ]
        await asyncio.sleep(0)
    await asyncio.gather(*pending)
    record = table.models.get(NAME)
    live = {v.loaded.served for v in record.versions.values() if v.loaded is not None} if record else set()
    for version in record.versions.values() if record else ():
        if (version.loaded is not None) != (version.state == VersionState.READY):
            violations.append(f"version {version.number} is {version.state} with loaded={version.loaded}")
    for model in models:
        if model not in live and not model.closed:
            violations.append(f"version {model.version} neither serving nor closed")
    for model in live:
        assert model.batcher.accepting
    await table.close()
    assert violations == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=events, max_loaded=st.one_of(st.none(), st.integers(1, 3)))
def test_version_table_properties(script: list[tuple[Any, ...]], max_loaded: int | None) -> None:
    asyncio.run(scenario(script, max_loaded))
