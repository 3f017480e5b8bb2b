"""Files the service re-reads when they change (the API keys, the TLS certificates), without a restart.

A file's signature is what `os.stat` says of it (following symlinks, so the atomic swap of a
Kubernetes Secret volume's `..data` link counts as a change); `watch` polls the signatures every
`interval` seconds and asks each `Reloadable` to re-read what changed. `reload_all` is what SIGHUP
runs: every file re-read at once, changed or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int, int] | None, ...]


def signature(paths: Iterable[Path]) -> Signature:
    """(mtime, size, inode, device) of each file, None for one that cannot be read."""
    out: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
    return tuple(out)


class Reloadable:
    """Something read from files that can be re-read while the service runs: `reload` re-reads them
    now (False: the old contents kept, the reason logged), `changed` says whether they differ from
    those last read (or last tried). Each re-read is counted under `kind` in `gmlp_file_reloads_total`."""

    kind = ""
    seen: Signature = ()
    metrics: ServiceMetrics

    @property
    def paths(self) -> list[Path]:
        raise NotImplementedError

    def reload(self) -> bool:
        raise NotImplementedError

    def changed(self) -> bool:
        return signature(self.paths) != self.seen

    def counted(self, ok: bool) -> bool:
        """`ok`, once the re-read is counted with that result."""
        self.metrics.file_reloads.labels(self.kind, "ok" if ok else "error").inc()
        return ok


def reload_all(items: Iterable[Reloadable]) -> None:
    for item in items:
        item.reload()


async def watch(items: Sequence[Reloadable], interval: float) -> None:
    """Re-read each item whose files changed, every `interval` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        for item in items:
            try:
                if item.changed():
                    item.reload()
            except Exception:  # a watcher that dies would silently stop every future rotation
                log.exception("re-reading %s failed", item)
