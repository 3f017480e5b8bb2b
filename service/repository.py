"""The model repository: find served-model directories, read their contract, name them.

A served-model directory is any directory whose `config.json` has `"format": "gmlp-served-model"`
(docs/formats.md). The repository is a directory of those (or one itself). Models are served under
their config `name`; two directories claiming the same name is a configuration error, not something
to resolve silently.

`prepare_repository` also closes the gap between training and serving on a developer machine:
a checkpoint under `checkpoints/` whose served directory is missing is exported first when torch
is importable; otherwise the error says which command to run.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SERVED_FORMAT = "gmlp-served-model"
CHECKPOINT_FORMAT = "gmlp-checkpoint"
VISION_TASK = "image-classification"
MLM_TASK = "fill-mask"
TASKS = (VISION_TASK, MLM_TASK)
DEFAULT_EXPORT_VARIANTS = ("fp32", "int8")


class RepositoryError(RuntimeError):
    """The repository cannot be served as configured; the message says how to fix it."""


@dataclass(frozen=True)
class ServedModelSpec:
    """What the service needs to know about one served-model directory (read from config.json)."""

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
            raise RepositoryError(f"{labels_file}: expected a JSON list of class names")
        return labels

    def tokenizer_path(self) -> Path:
        return self.path / str(
            self.model_config.get("tokenizer") or self.config.get("tokenizer") or "tokenizer.json"
        )


def read_spec(directory: Path) -> ServedModelSpec | None:
    """The spec of `directory` if it is a served-model directory, else None; malformed -> error."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RepositoryError(f"{config_file}: unreadable config ({exc})") from exc
    if not isinstance(config, dict) or config.get("format") != SERVED_FORMAT:
        return None
    name, task = config.get("name") or directory.name, config.get("task")
    if task not in TASKS:
        raise RepositoryError(f"{config_file}: task {task!r} is not one of {list(TASKS)}")
    variants = config.get("variants") or {}
    missing = [f for f in variants.values() if not (directory / f).is_file()]
    if not variants or missing:
        raise RepositoryError(f"{config_file}: variant files missing: {missing or 'no variants listed'}")
    return ServedModelSpec(name=str(name), task=str(task), path=directory.resolve(), config=config)


def discover(repository: Path) -> dict[str, ServedModelSpec]:
    """All served models in `repository` (itself or its immediate subdirectories), by name."""
    if not repository.is_dir():
        raise RepositoryError(f"model repository {repository} does not exist or is not a directory")
    candidates = [repository, *sorted(p for p in repository.iterdir() if p.is_dir())]
    specs: dict[str, ServedModelSpec] = {}
    for directory in candidates:
        spec = read_spec(directory)
        if spec is None:
            continue
        if spec.name in specs:
            raise RepositoryError(
                f"two served models are named {spec.name!r}: {specs[spec.name].path} and {spec.path}"
            )
        specs[spec.name] = spec
    return specs


def _is_checkpoint(directory: Path) -> bool:
    try:
        return json.loads((directory / "config.json").read_text()).get("format") == CHECKPOINT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def export_command(checkpoint: Path, out_dir: Path) -> str:
    return f"gmlp export {checkpoint} --out {out_dir}"


def export_missing(checkpoint_dir: Path | None, repository: Path, variants: tuple[str, ...]) -> list[Path]:
    """Export every checkpoint in `checkpoint_dir` whose served directory `repository/<name>` is missing.

    Returns the directories written. Without torch (the serving image) this raises with the
    exact command to run on a machine that has it.
    """
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return []
    todo = []
    for ckpt in sorted(p for p in checkpoint_dir.iterdir() if p.is_dir() and _is_checkpoint(p)):
        out_dir = repository / ckpt.name
        if not (out_dir / "config.json").is_file():
            todo.append((ckpt, out_dir))
    if not todo:
        return []
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("export") is None:
        commands = "; ".join(export_command(c, o) for c, o in todo)
        raise RepositoryError(
            f"checkpoints without an exported served model (torch is not installed): run {commands}"
        )
    from export import export_served_model  # torch-side code, imported only when needed

    repository.mkdir(parents=True, exist_ok=True)
    written = []
    for ckpt, out_dir in todo:
        log.info("exporting checkpoint %s -> %s (variants %s)", ckpt, out_dir, ", ".join(variants))
        export_served_model(ckpt, out_dir, variants=list(variants))
        written.append(out_dir)
    return written


def prepare_repository(
    repository: Path,
    checkpoint_dir: Path | None = None,
    *,
    export_variants: tuple[str, ...] = DEFAULT_EXPORT_VARIANTS,
) -> dict[str, ServedModelSpec]:
    """Export what is missing, then discover; at least one model must be found."""
    export_missing(checkpoint_dir, repository, export_variants)
    specs = discover(repository)
    if not specs:
        hint = ""
        if checkpoint_dir is not None and checkpoint_dir.is_dir():
            hint = f" (and no checkpoints in {checkpoint_dir})"
        raise RepositoryError(
            f"no served models (directories with a {SERVED_FORMAT} config.json) in {repository}{hint}; "
            f"create one with `{export_command(Path('CHECKPOINT_DIR'), repository / 'NAME')}`"
        )
    return specs


__all__ = [
    "ServedModelSpec",
    "RepositoryError",
    "read_spec",
    "discover",
    "prepare_repository",
    "export_missing",
    "VISION_TASK",
    "MLM_TASK",
]
