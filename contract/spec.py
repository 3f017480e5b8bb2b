"""Reading a served-model directory: its spec (config.json).

A served-model directory is any directory whose `config.json` has `"format": "gmlp-served-model"`
(docs/formats.md); a model repository of them is read by `contract.scan`.

A config is read from outside (whoever can write to the repository), so reading it is bounded and
strict: at most `MAX_CONFIG_BYTES`, UTF-8 JSON, a printable `name`, and every file it names
(variants, labels, tokenizer, recorded check; the defaults too) confined to the model's directory:
a relative path without `..` whose real path, symlinks followed, stays inside the directory
(`confined`). The accessors check again at use, so a link swapped after the scan reaches nothing.

Every file of a model directory is read as a regular file only (`open_regular`): opened without
blocking, then `fstat` on the descriptor decides. A FIFO, socket or device (or a symlink to one)
would block the reading thread for good or stream without end, so it is refused with a reason,
as is a file over its bound in `contract.limits`, before a byte of it is read. `read_spec` checks
the same of every file the service will read (`ModelSpec.file_problems`), so such a version is
listed UNAVAILABLE by the scan before any load is tried.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from contract.errors import UserError
from contract.formats import (
    CARD_FILE,
    CHECKPOINT_FORMAT,
    CONFIG_FILE,
    MLM_TASK,
    SERVED_FORMAT,
    TASKS,
    VISION_TASK,
)
from contract.limits import MAX_CARD_BYTES, MAX_CONFIG_BYTES, MAX_LABELS_BYTES, MAX_TOKENIZER_BYTES


class SpecError(UserError):
    """A directory or repository cannot be served as it is; the message says how to fix it."""


MAX_NAME_CHARS = 200
DEFAULT_LABELS, DEFAULT_TOKENIZER = "labels.json", "tokenizer.json"


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


def model_name_problem(name: object) -> str | None:
    """Why `name` cannot name a model (it appears in URL paths, logs and metrics), or None."""
    if not isinstance(name, str) or not name:
        return f"a model name is a non-empty string, not {name!r}"[:300]
    if len(name) > MAX_NAME_CHARS or not name.isprintable() or "/" in name:
        return (
            f"model name {name[:60]!r}: at most {MAX_NAME_CHARS} printable characters, without '/' "
            "(not valid UTF-8 or holding control characters otherwise)"
        )
    return None


@dataclass(frozen=True)
class ModelSpec:
    """What a served-model directory declares (read from its config.json)."""

    name: str
    task: str
    path: Path
    config: dict[str, Any] = field(repr=False)

    @property
    def variants(self) -> dict[str, str]:
        return dict(self.config.get("variants") or {})

    @property
    def model_config(self) -> dict[str, Any]:
        return dict(self.config.get("model") or {})

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return list(self.config.get("inputs") or [])

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return list(self.config.get("outputs") or [])

    @property
    def seq_len(self) -> int | None:
        return self.config.get("seq_len")

    def variant_path(self, variant: str) -> Path:
        """The ONNX file of `variant`, checked to be a regular file (the runtime opens it itself,
        and would block on a FIFO)."""
        path = confined(self.path, self.variants[variant], f"variant {variant}")
        open_regular(path, f"variant {variant}", None).close()
        return path

    def labels(self) -> list[str]:
        """Class names (classifiers): the `labels` file, in index order (at most `MAX_LABELS_BYTES`)."""
        labels_file = confined(self.path, self.config.get("labels") or DEFAULT_LABELS, "labels")
        try:
            labels = read_json(labels_file, MAX_LABELS_BYTES, "labels")
        except SpecError:
            raise
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
            raise SpecError(
                f"{labels_file}: unreadable labels ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise SpecError(f"{labels_file}: expected a JSON list of class names")
        return labels

    def tokenizer_path(self) -> Path:
        return confined(self.path, self.named_files()["tokenizer"], "tokenizer")

    def named_files(self) -> dict[str, object]:
        """Every file the config names, by what it is (the defaults included)."""
        files: dict[str, object] = {f"variant {v}": f for v, f in self.variants.items()}
        files["labels"] = self.config.get("labels") or DEFAULT_LABELS
        files["tokenizer"] = (
            self.model_config.get("tokenizer") or self.config.get("tokenizer") or DEFAULT_TOKENIZER
        )
        if isinstance(self.config.get("check"), dict):
            files["check file"] = self.config["check"].get("file")
        return files

    def file_problems(self) -> list[str]:
        """Why files the service will read from the directory cannot be read (`file_problem`: not
        regular files, or over their bounds), of those that are there: the variants, the check,
        the task's labels or tokenizer, the card. A missing file is not a problem here."""
        named = self.named_files()
        read: dict[str, tuple[object, int | None]] = {
            what: (name, None) for what, name in named.items() if what.startswith("variant ")
        }
        read["check file"] = (named.get("check file"), None)
        if self.task == VISION_TASK:
            read["labels"] = (named["labels"], MAX_LABELS_BYTES)
        if self.task == MLM_TASK:
            read["tokenizer"] = (named["tokenizer"], MAX_TOKENIZER_BYTES)
        read["card"] = (CARD_FILE, MAX_CARD_BYTES)
        problems = []
        for what, (name, limit) in read.items():
            if not isinstance(name, str):
                continue
            path = self.path / name
            try:
                status = os.stat(path)  # never blocks, whatever the file is
            except OSError:  # missing (said elsewhere where it must be there), or a link loop
                continue
            problem = file_problem(path, what, limit, status)
            if problem is not None:
                problems.append(problem)
        return problems


def is_checkpoint(directory: Path) -> bool:
    """Whether `directory`'s config.json declares the checkpoint format."""
    try:
        config = read_json(directory / CONFIG_FILE, MAX_CONFIG_BYTES)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("format") == CHECKPOINT_FORMAT


def read_json(path: Path, limit: int, what: str = "file") -> Any:
    """The JSON document in `path`, read without trusting it: a regular file of at most `limit`
    bytes of UTF-8 (SpecError or another ValueError otherwise; RecursionError as parsing raises it)."""
    return json.loads(read_regular(path, what, limit).decode("utf-8"))


def read_spec(directory: Path) -> ModelSpec | None:
    """The spec of `directory` if it is a served-model directory, else None; malformed -> SpecError."""
    config_file = directory / CONFIG_FILE
    if not config_file.exists():
        return None
    resolved = confined(directory, CONFIG_FILE, "config")
    try:  # bounded, UTF-8, JSON: SpecError otherwise, never another error
        config = read_json(resolved, MAX_CONFIG_BYTES, "config")
    except SpecError as exc:  # not a regular file, over its bound: the reason says so already
        raise SpecError(f"unreadable config: {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON
        raise SpecError(f"{resolved}: unreadable config ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(config, dict) or config.get("format") != SERVED_FORMAT:
        return None
    name, task = config.get("name") or directory.name, config.get("task")
    problem = model_name_problem(name)
    if problem is not None:
        raise SpecError(f"{config_file}: {problem}")
    if task not in TASKS:
        raise SpecError(f"{config_file}: task {str(task)[:60]!r} is not one of {list(TASKS)}")
    # The shapes the accessors rely on, and every named file inside the directory.
    for key in ("variants", "model", "preprocessing", "check"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise SpecError(f"{config_file}: {key!r} must be a JSON object")
    spec = ModelSpec(name=str(name), task=str(task), path=directory.resolve(), config=config)
    for what, file in spec.named_files().items():
        confined(directory, file, what)
    missing = [f for f in spec.variants.values() if not (directory / f).exists()]
    if not spec.variants or missing:
        raise SpecError(f"{config_file}: variant files missing: {missing or 'no variants listed'}")
    problems = spec.file_problems()
    if problems:
        raise SpecError("; ".join(problems))
    return spec


def export_command(checkpoint: Path, out_dir: Path) -> str:
    """The command that turns a checkpoint into a served-model directory (quoted in error messages)."""
    return f"gmlp export {checkpoint} --out {out_dir}"
