"""The processes of a `gmlp serve` tree as the tests see them: the engine, the front-ends, their
sockets (psutil)."""

from __future__ import annotations

from pathlib import Path

import psutil


def children_of(root: int) -> list[psutil.Process]:
    """The supervisor's living children: the engine and the front-ends (multiprocessing's resource
    tracker is not one)."""
    found = []
    for process in psutil.Process(root).children():
        try:
            if "spawn_main" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:  # ended (a zombie until the supervisor reaps it)
            pass
    return found


def is_engine(process: psutil.Process) -> bool:
    """Whether `process` is the engine: the one listening on the engine's Unix socket."""
    try:
        return any(str(c.laddr).endswith("engine.sock") for c in process.connections(kind="unix"))
    except psutil.Error:
        return False


def engine_of(root: int) -> psutil.Process | None:
    return next((p for p in children_of(root) if is_engine(p)), None)


def workers_of(root: int) -> list[psutil.Process]:
    """The supervisor's living front-end processes (`--workers` of them)."""
    return [p for p in children_of(root) if not is_engine(p)]


def listening_ports(process: psutil.Process) -> set[int]:
    return {c.laddr.port for c in process.connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def established_on(process: psutil.Process, port: int) -> int:
    return sum(
        1
        for c in process.connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
    )


def private_folder_of(root: int) -> Path:
    """The server's private folder: where the engine's socket is."""
    engine = engine_of(root)
    assert engine is not None
    (socket,) = {
        str(c.laddr) for c in engine.connections(kind="unix") if str(c.laddr).endswith("engine.sock")
    }
    return Path(socket).parent
