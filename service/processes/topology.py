"""Who a process is in a server of several, handed to it as an argument by the supervisor.

A server of one process has no topology (None). With `workers` > 1 the supervisor
(`service.server`) starts one engine process, which owns the models, their versions, batchers and
sessions, and `workers` front-end processes, which own the sockets and every request's own work;
each gets a `Topology` saying which it is and where the others are, and nothing else tells it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from contract.errors import UserError


class Role(StrEnum):
    ENGINE = "engine"
    FRONT = "front-end"


@dataclass(frozen=True)
class Topology:
    """A process's place in the server: its `role` (and a front-end's `index` among `fronts`), the
    server's private folder (0700: the engine's socket, every process's metrics files), the token
    a front-end shows the engine, the CPUs of the whole server (a one-row run may use all of them,
    `ServiceSettings.resolved_lone_threads`) and the names of its shared memory."""

    role: Role
    index: int
    fronts: int
    folder: Path
    token: bytes
    server_cpus: int
    shared_memory: str  # the prefix of the names of the server's shared-memory blocks

    def arena(self, side: str, index: int) -> str:
        """The name of the shared-memory block `side` ("front-end", "engine") writes for front-end
        `index`: one per place, reused by a process that replaces another."""
        return f"{self.shared_memory}-{side[0]}{index}"

    @property
    def engine_socket(self) -> Path:
        return self.folder / "engine.sock"

    @property
    def metrics(self) -> Path:
        return self.folder / "metrics"

    def keep_metrics(self) -> None:
        """Have prometheus_client keep this process's series in files of the server's folder
        (its multiprocess mode, which it reads from the environment once, when imported: call
        this first), where the supervisor and every front-end read every process's."""
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics)

    @property
    def name(self) -> str:
        return "engine" if self.role is Role.ENGINE else f"front-end {self.index}"

    def as_front(self, index: int) -> Topology:
        return replace(self, role=Role.FRONT, index=index)


def private_folder(path: Path) -> None:
    """`path` as a folder of this process's user that nobody else may enter, made if missing;
    UserError where something else stands there (another user's folder, a link someone put in the
    place of one a cleaner removed)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise UserError(f"{path} is not this server's private folder any more: not restarting workers")


@dataclass(frozen=True)
class WorkerLink:
    """What a child process tells its supervisor (`service.server`), through the shared objects
    the supervisor handed it: that its models are loaded (a front-end listens from then on), and,
    in `beat`, the monotonic time of its event loop's latest turn, renewed every `BEAT_S`, so that
    a child stopped or stuck is seen, killed and replaced. (Here, not beside the app: a child
    unpickles it before it runs, and it must import nothing that reads the environment.)"""

    loaded: Any  # a multiprocessing Event
    beat: Any  # a multiprocessing Value of type "d"

    async def report(self) -> None:
        self.beat.value = time.monotonic()  # before `loaded`: the supervisor reads both together
        self.loaded.set()
        while True:
            await asyncio.sleep(BEAT_S)
            self.beat.value = time.monotonic()


BEAT_S = 1.0
