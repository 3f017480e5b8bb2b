"""Reading a served-model directory: its spec (config.json), and a repository of such directories.

A served-model directory is any directory whose `config.json` has `"format": "gmlp-served-model"`
(docs/formats.md). A model repository is a directory of those (or one itself). Models are named by
their config `name`; two directories claiming the same name is a configuration error, not something
to resolve silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.errors import UserError
from contract.formats import CHECKPOINT_FORMAT, CONFIG_FILE, SERVED_FORMAT, TASKS


class SpecError(UserError):
    """A directory or repository cannot be served as it is; the message says how to fix it."""


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
    def preprocessing(self) -> dict[str, Any]:
        return dict(self.config.get("preprocessing") or {})

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
        return self.path / self.variants[variant]

    def labels(self) -> list[str]:
        """Class names (classifiers): the `labels` file, in index order."""
        labels_file = self.path / str(self.config.get("labels", "labels.json"))
        labels = json.loads(labels_file.read_text())
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise SpecError(f"{labels_file}: expected a JSON list of class names")
        return labels

    def tokenizer_path(self) -> Path:
        return self.path / str(
            self.model_config.get("tokenizer") or self.config.get("tokenizer") or "tokenizer.json"
        )


def read_format(directory: Path) -> str | None:
    """The `format` a directory's config.json declares (served model, checkpoint), or None."""
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return config.get("format") if isinstance(config, dict) else None


def is_checkpoint(directory: Path) -> bool:
    return read_format(directory) == CHECKPOINT_FORMAT


def read_spec(directory: Path) -> ModelSpec | None:
    """The spec of `directory` if it is a served-model directory, else None; malformed -> SpecError."""
    config_file = directory / CONFIG_FILE
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{config_file}: unreadable config ({exc})") from exc
    if not isinstance(config, dict) or config.get("format") != SERVED_FORMAT:
        return None
    name, task = config.get("name") or directory.name, config.get("task")
    if task not in TASKS:
        raise SpecError(f"{config_file}: task {task!r} is not one of {list(TASKS)}")
    variants = config.get("variants") or {}
    missing = [f for f in variants.values() if not (directory / f).is_file()]
    if not variants or missing:
        raise SpecError(f"{config_file}: variant files missing: {missing or 'no variants listed'}")
    return ModelSpec(name=str(name), task=str(task), path=directory.resolve(), config=config)


def discover(repository: Path) -> dict[str, ModelSpec]:
    """All served models in `repository` (itself or its immediate subdirectories), by name."""
    if not repository.is_dir():
        raise SpecError(f"model repository {repository} does not exist or is not a directory")
    candidates = [repository, *sorted(p for p in repository.iterdir() if p.is_dir())]
    specs: dict[str, ModelSpec] = {}
    for directory in candidates:
        spec = read_spec(directory)
        if spec is None:
            continue
        if spec.name in specs:
            raise SpecError(
                f"two served models are named {spec.name!r}: {specs[spec.name].path} and {spec.path}"
            )
        specs[spec.name] = spec
    return specs


def export_command(checkpoint: Path, out_dir: Path) -> str:
    """The command that turns a checkpoint into a served-model directory (quoted in error messages)."""
    return f"gmlp export {checkpoint} --out {out_dir}"


def require_models(repository: Path) -> dict[str, ModelSpec]:
    """`discover`, refusing a repository without any served model (with the command that makes one)."""
    specs = discover(repository)
    if not specs:
        raise SpecError(
            f"no served models (directories with a {SERVED_FORMAT} config.json) in {repository}; "
            f"create one with `{export_command(Path('CHECKPOINT_DIR'), repository / 'NAME')}`"
        )
    return specs


__all__ = [
    "ModelSpec",
    "SpecError",
    "read_format",
    "is_checkpoint",
    "read_spec",
    "discover",
    "require_models",
    "export_command",
]
