"""Reading a served-model directory: its spec (config.json).

A served-model directory is any directory whose `config.json` has `"format": "gmlp-served-model"`
(docs/formats.md); a model repository of them is read by `contract.scan`.

A config is read from outside (whoever can write to the repository), so reading it is bounded and
strict: at most `MAX_CONFIG_BYTES` of JSON read by the one strict parser of every JSON door
(`contract.strict_json`), a printable `name`, and every file it names (variants, labels,
tokenizer, recorded check; the defaults too) `confined` to the model's directory and read as a
regular file only (`open_regular`; both in `contract.files`, re-exported here).
`read_spec` checks the kind and size of every file the service will read
(`ModelSpec.file_problems`), so a FIFO or an oversized file makes the version UNAVAILABLE in the
scan before any load is tried.

An ONNX file may name further files itself: tensors whose bytes are external data, which the
runtime opens on its own. `contract.external_data` holds each such location to the same rules and
to two more a name cannot show (one link only, `offset` + `length` inside the file); the scan asks
it of every variant, and so does `variant_path`, through which the runtimes, commands and checks
reach a graph.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import strict_json
from contract.external_data import GraphFormatError, external_data_problems, refuse_external_data
from contract.files import SpecError, confined, file_problem, read_regular
from contract.files import open_regular as open_regular  # read from here by the service
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

MAX_NAME_CHARS = 200
DEFAULT_LABELS, DEFAULT_TOKENIZER = "labels.json", "tokenizer.json"


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
        """The ONNX file of `variant`, checked to be a regular file whose external data stays
        inside its directory (`refuse_external_data`): the runtime opens both itself, and would
        block on a FIFO or read whatever a location names."""
        path = confined(self.path, self.variants[variant], f"variant {variant}")
        refuse_external_data(path, f"variant {variant}")
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
        the task's labels or tokenizer, the card; and the variants' external data
        (`external_data_problems`). A missing file is not a problem here, nor a variant that is
        no ONNX file at all: its load says so."""
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
            elif what.startswith("variant "):
                try:
                    problems.extend(external_data_problems(confined(self.path, name, what), what))
                except SpecError as exc:  # swapped since the stat, or resolving outside
                    problems.append(str(exc))
                except GraphFormatError:
                    pass
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
    bytes (SpecError otherwise), parsed by `strict_json.loads_written` (UTF-8, finite numbers,
    nesting at most 64 deep; JSONError, a ValueError, otherwise)."""
    return strict_json.loads_written(read_regular(path, what, limit))


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
