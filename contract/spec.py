"""Reading a served-model directory: its spec (config.json).

A served-model directory is any directory whose `config.json` has `"format": "gmlp-served-model"`
(docs/formats.md); a model repository of them is read by `contract.scan`.

A config is read from outside (whoever can write to the repository), so reading it is bounded and
strict: at most `MAX_CONFIG_BYTES`, UTF-8 JSON, a printable `name`, and every file it names
(variants, labels, tokenizer, recorded check; the defaults too) confined to the model's directory:
a relative path without `..` whose real path, symlinks followed, stays inside the directory
(`confined`). The accessors check again at use, so a link swapped after the scan reaches nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from contract.errors import UserError
from contract.formats import CHECKPOINT_FORMAT, CONFIG_FILE, SERVED_FORMAT, TASKS


class SpecError(UserError):
    """A directory or repository cannot be served as it is; the message says how to fix it."""


MAX_CONFIG_BYTES = 1 << 20  # an export's config.json is a few KiB
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
        return confined(self.path, self.variants[variant], f"variant {variant}")

    def labels(self) -> list[str]:
        """Class names (classifiers): the `labels` file, in index order."""
        labels_file = confined(self.path, self.config.get("labels") or DEFAULT_LABELS, "labels")
        labels = json.loads(labels_file.read_text())
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


def is_checkpoint(directory: Path) -> bool:
    """Whether `directory`'s config.json declares the checkpoint format."""
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == CHECKPOINT_FORMAT


def read_json(path: Path, limit: int) -> Any:
    """The JSON document in `path`, read without trusting it: at most `limit` bytes of UTF-8
    (ValueError otherwise; OSError or RecursionError as reading and parsing raise them)."""
    with path.open("rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return json.loads(raw.decode("utf-8"))


def read_spec(directory: Path) -> ModelSpec | None:
    """The spec of `directory` if it is a served-model directory, else None; malformed -> SpecError."""
    config_file = directory / CONFIG_FILE
    if not config_file.is_file():
        return None
    resolved = confined(directory, CONFIG_FILE, "config")
    try:  # bounded, UTF-8, JSON: SpecError otherwise, never another error
        config = read_json(resolved, MAX_CONFIG_BYTES)
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
    missing = [f for f in spec.variants.values() if not (directory / f).is_file()]
    if not spec.variants or missing:
        raise SpecError(f"{config_file}: variant files missing: {missing or 'no variants listed'}")
    return spec


def export_command(checkpoint: Path, out_dir: Path) -> str:
    """The command that turns a checkpoint into a served-model directory (quoted in error messages)."""
    return f"gmlp export {checkpoint} --out {out_dir}"
