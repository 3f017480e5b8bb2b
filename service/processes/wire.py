"""What travels between the engine process and a front-end process, and how.

Messages are small tuples framed on a Unix socket (a length, then the pickle): which model and
version, the answer a row asks for, a result's timings, a refusal. Tensors do not go into them:
the sender writes each array once into a shared-memory `Arena` of its own and sends where it lies
(`Placed`); the receiver reads it in place (the engine's batch collation is the one copy of a
request's rows) or copies it out once (a front-end, the outputs a v2 request asks for), and then
says the space may be reused. An array that does not fit the arena at the moment travels in the
message instead: slower, never refused.

Both ends are processes of one server, started by its supervisor, on a socket in the server's
private folder, and each connection opens with the server's random token: nothing else can speak
on it. The socket is still read with a bound on a frame's size.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # the module SharedMemory itself uses
import asyncio
import contextlib
import mmap
import os
import pickle
import struct
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from contract import errors
from contract.errors import ErrorCode, InternalError, RequestError

_LENGTH = struct.Struct("!I")
# A frame holds small values and, where an arena was full, arrays inline: bounded all the same.
MAX_FRAME_BYTES = 1 << 30
ALIGN = 64  # each array starts on a cache line


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; IncompleteReadError at the end of the stream."""
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {size} bytes: more than a process of this server sends")
    return pickle.loads(await reader.readexactly(size))


def frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


@dataclass(frozen=True)
class Placed:
    """Where an array lies in its sender's arena."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    size: int  # bytes reserved


Tensors = dict[str, "Placed | np.ndarray"]


class Arena:
    """A shared-memory block one process writes arrays into for one other process to read.

    The writer allocates (first fit over a sorted free list) and frees when the reader says it is
    done with a block; the reader only maps it (`Mapped`). The space is reserved on creation
    (`posix_fallocate`), so that a full /dev/shm (a container's is 64 MiB by default) is an arena
    of no size, whose arrays all travel inline, not a SIGBUS at the first write."""

    def __init__(self, name: str, size: int) -> None:
        # One name per place in the server (a front-end's number, the engine's arena for it): a
        # process that was killed and replaced leaves one block behind at most, replaced here.
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name)
        self.memory = SharedMemory(name, create=True, size=size)
        try:
            os.posix_fallocate(self.memory._fd, 0, size)  # type: ignore[attr-defined]
            self._free: list[tuple[int, int]] = [(0, size)]
        except OSError:
            self._free = []
        self.name = self.memory.name

    def place(self, arrays: dict[str, np.ndarray]) -> Tensors:
        """`arrays` written into the arena where they fit (else kept, to travel inline)."""
        placed: Tensors = {}
        for key, array in arrays.items():
            spot = None if array.dtype.hasobject else self._alloc(max(array.nbytes, 1))
            if spot is None:
                placed[key] = array
                continue
            size = -(-max(array.nbytes, 1) // ALIGN) * ALIGN
            view = np.ndarray(array.shape, array.dtype, buffer=self.memory.buf, offset=spot)
            view[...] = array
            placed[key] = Placed(spot, array.dtype.str, array.shape, size)
        return placed

    def release(self, tensors: Tensors) -> None:
        """Free the blocks of `tensors` (the reader is done with them)."""
        for value in tensors.values():
            if isinstance(value, Placed):
                self._give_back(value.offset, value.size)

    def _alloc(self, nbytes: int) -> int | None:
        size = -(-nbytes // ALIGN) * ALIGN
        for i, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, length - size)
                return start
        return None

    def _give_back(self, start: int, size: int) -> None:
        free = self._free
        i = next((k for k, (s, _) in enumerate(free) if s > start), len(free))
        free.insert(i, (start, size))
        if i + 1 < len(free) and start + size == free[i + 1][0]:  # merge with the next block
            free[i] = (start, size + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == start:  # and with the previous one
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    def close(self) -> None:
        self.memory.close()
        with contextlib.suppress(FileNotFoundError):
            self.memory.unlink()


class Mapped:
    """Another process's `Arena`, mapped for reading.

    Mapped by hand rather than as a `SharedMemory`: Python 3.11 registers every mapping with the
    resource tracker the server's processes share, and the reader's registration would be the
    writer's, so that the block would be unlinked (or forgotten) with the wrong process."""

    def __init__(self, name: str) -> None:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)

    def view(self, tensors: Tensors) -> dict[str, np.ndarray]:
        """The arrays in place: valid until the writer is told it may reuse their blocks."""
        return {key: self._one(value) for key, value in tensors.items()}

    def copy(self, tensors: Tensors) -> dict[str, np.ndarray]:
        """The arrays copied out of the arena (the blocks may be released at once)."""
        return {key: np.array(self._one(value)) for key, value in tensors.items()}

    def _one(self, value: Placed | np.ndarray) -> np.ndarray:
        if isinstance(value, np.ndarray):
            return value
        return np.ndarray(value.shape, np.dtype(value.dtype), buffer=self.buf, offset=value.offset)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still held: the mapping goes with the process
            self.buf.release()
            self._map.close()


def refusal(exc: BaseException) -> tuple[str, str, str, int | None]:
    """A request's refusal as it crosses: its type, code (the member's name), message and
    Retry-After; anything not a `RequestError` is an internal error (its detail stays in the
    engine's log)."""
    if not isinstance(exc, RequestError):
        exc = InternalError(ErrorCode.INTERNAL_ERROR, "the model run failed; see the server log")
    return type(exc).__name__, exc.code.name, exc.message, getattr(exc, "retry_after_s", None)


def refused(sent: tuple[str, str, str, int | None]) -> RequestError:
    """The `RequestError` a `refusal` describes, as the engine raised it."""
    kind, code, message, retry_after_s = sent
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, RequestError)):
        return InternalError(ErrorCode.INTERNAL_ERROR, message)
    if issubclass(cls, errors.Unavailable):
        return cls(ErrorCode[code], message, retry_after_s=retry_after_s)
    return cls(ErrorCode[code], message)
