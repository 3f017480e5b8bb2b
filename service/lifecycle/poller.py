"""Poll model control: rescan the repository every `GMLP_REPOSITORY_POLL_S` and apply what changed.

A model's versions are applied once its directories looked the same in two scans in a row (so
nothing half-written is loaded); a model gone from the repository is unloaded; a model whose
directory has a model-level problem (`ModelSource.problem`) is only noted, its versions left as
they are. Nothing a directory holds can stop the poller: the scan reads each directory in
isolation (`contract.scan`), and one model's failed load is logged and the next one applied.
Should the loop fail anyway (a bug), it is restarted after one interval, logged with its
traceback and counted (`gmlp_repository_poller_restarts_total`), so models deployed later still
load and shutdown still drains.

`ScanReport` is what every scan's result goes through (start-up, each poll, a load call): each
problem is logged once, when it first appears, and `gmlp_repository_problems` counts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from contract.errors import InvalidInput
from contract.scan import ModelSource, problems_of, scan
from contract.spec import SpecError
from service.lifecycle.versions import VersionTable
from service.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)


class ScanReport:
    """Logs each problem of a scan once (when it first appears) and keeps the problems gauge."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics
        self._seen: set[str] = set()

    def __call__(self, sources: dict[str, ModelSource]) -> None:
        found = set(problems_of(sources))
        for problem in sorted(found - self._seen):
            log.warning("model repository: %s", problem)
        self._seen = found
        self._metrics.repository_problems.set(len(found))


@dataclass(eq=False)
class RepositoryPoller:
    """The poll loop of one service, with its supervisor (see the module docstring)."""

    table: VersionTable[Any]
    repository: Path
    interval_s: float
    metrics: ServiceMetrics
    _: KW_ONLY
    report: Callable[[dict[str, ModelSource]], None]
    after_scan: Callable[[], None]
    scanner: Callable[[Path], dict[str, ModelSource]] = scan
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name="poll-repository")

    async def stop(self) -> None:
        """Cancel the loop and wait for it; nothing it raises keeps shutdown from draining."""
        if self._task is None:
            return
        self._task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await self._task

    async def _supervise(self) -> None:
        while True:
            try:
                await self._poll()
            except Exception:
                self.metrics.poller_restarts.inc()
                log.exception("the repository poller failed; restarting it in %s s", self.interval_s)
                await asyncio.sleep(self.interval_s)

    async def _poll(self) -> None:
        previous: dict[str, ModelSource] = {}
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                sources = await asyncio.to_thread(self.scanner, self.repository)
            except SpecError as exc:  # the repository itself is gone or cannot be listed
                log.warning("repository scan skipped: %s", exc)
                continue
            self.report(sources)
            for name, source in sources.items():
                if source.problem is not None:
                    self.table.note(source)
                    continue
                before = previous.get(name)
                if before is not None and _prints(before) == _prints(source):
                    await self._apply(source)
            for name in [n for n in self.table.models if n not in sources]:
                await self._apply(ModelSource(name))
            previous = sources
            self.after_scan()

    async def _apply(self, source: ModelSource) -> None:
        try:
            await self.table.apply(source)
        except InvalidInput as exc:  # refused (too many versions): the index says so
            log.warning("model %s: %s", source.name, exc.message)
        except Exception:  # one model's failure never keeps the others from being applied
            log.exception("model %s: applying its repository directory failed", source.name)


def _prints(source: ModelSource) -> dict[int, object]:
    return {v: s.fingerprint for v, s in source.versions.items()}
