"""Reading the files of a model directory without trusting them: where a name may lead, and what
kind of file may be read.

Whoever can write to the model repository chooses every name a config or a graph holds, so a name
is `confined` to its directory: a relative path without `..` whose real path, symlinks followed,
stays inside the directory. The accessors check again at use, so a link swapped after the scan
reaches nothing.

Every file of a model directory is read as a regular file only (`open_regular`): opened without
blocking, then `fstat` on the descriptor decides. A FIFO, socket or device (or a symlink to one)
would block the reading thread for good or stream without end, so it is refused with a reason,
as is a file over its bound in `contract.limits`, before a byte of it is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from contract.errors import UserError


class SpecError(UserError):
    """A directory or repository cannot be served as it is; the message says how to fix it."""


def confined(directory: Path, name: object, what: str = "file") -> Path:
    """`directory / name`, refused (SpecError) unless `name` is a relative path without `..` whose
    real path (symlinks followed) stays inside `directory`'s real path. Existence is not checked."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise SpecError(f"{what} {name!r}: expected a file name relative to the model's directory")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise SpecError(
            f"{what} {name[:200]!r}: must be a path inside the model's directory (no '/...', no '..')"
        )
    try:
        root = directory.resolve()
        path = (root / relative).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise SpecError(f"{what} {name[:200]!r}: cannot be resolved ({exc})") from None
    if not path.is_relative_to(root):
        raise SpecError(f"{what} {name[:200]!r}: resolves outside the model's directory (a symlink)")
    return path


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def file_problem(path: Path, what: str, limit: int | None, status: os.stat_result) -> str | None:
    """Why the file `status` describes cannot be read as `what` (not a regular file, or over
    `limit` bytes), or None."""
    if not stat.S_ISREG(status.st_mode):
        kind = next((name for test, name in _KINDS if test(status.st_mode)), "a special file")
        return f"{what} {path}: {kind}, not a regular file (reading one could block or never end)"
    if limit is not None and status.st_size > limit:
        return (
            f"{what} {path}: {status.st_size:,} bytes, larger than its bound of {limit:,} bytes "
            "(contract/limits.py)"
        )
    return None


def open_regular(path: Path, what: str, limit: int | None) -> BinaryIO:
    """`path` open for reading, refused (SpecError) unless it is a regular file of at most `limit`
    bytes (any size: None). Opened with O_NONBLOCK, so that a FIFO swapped in after the `stat` that
    refuses it beforehand still cannot block; `fstat` on the descriptor decides, so a regular file
    is all that is ever read. A missing or unreadable file is a SpecError too."""
    try:
        problem = file_problem(path, what, limit, os.stat(path))  # a device is not even opened
        if problem is not None:
            raise SpecError(problem)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise SpecError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        problem = file_problem(path, what, limit, os.fstat(fd))  # what was opened, swapped or not
        if problem is not None:
            raise SpecError(problem)
        os.set_blocking(fd, True)  # a regular file: plain reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, read as `open_regular` opens it; at most `limit` (a file that grew past
    its bound while it was read is refused too)."""
    with open_regular(path, what, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise SpecError(f"{what} {path}: larger than its bound of {limit:,} bytes (it grew while read)")
    return data
