"""What the model repository holds on disk: models, their versions, and which versions to serve.

Two layouts, side by side in one repository (Triton's, and the flat one of a single export):

    models/NAME/1/config.json ...   versioned: each numbered directory is one exported version
    models/NAME/config.json ...     flat: the export itself is version 1

The model's name is the directory's name in the versioned layout, the config's `name` in the flat
one. A version directory is *complete* when its `config.json` exists and every file the config
names (variants, labels, tokenizer, recorded check) is there: an export written in place must
write `config.json` last (`gmlp export` moves a verified directory into place whole, which is the
same). The poller also waits until a directory looks the same in two scans running
`GMLP_REPOSITORY_POLL_S` apart (`fingerprint`: names, sizes and modification times), so a copy
that writes `config.json` early is still not loaded half-written.

The version policy (Triton's): `latest:N` (the N highest complete versions), `all`, or
`specific:1,3`; server-wide from `GMLP_VERSION_POLICY`, per model from `NAME/policy.json`
(`{"version_policy": "latest:2"}`, or Triton's `{"latest": {"num_versions": 2}}` form), or from
the `config` parameter of a repository load call. Nothing here loads a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from contract.formats import CONFIG_FILE, SERVED_FORMAT
from contract.spec import ModelSpec, SpecError, export_command, read_spec
from service.core import strict_json

POLICY_FILE = "policy.json"
FLAT_VERSION = 1

Fingerprint = tuple[tuple[str, int, int], ...]


class PolicyError(ValueError):
    """A version policy that cannot be read; the message says which forms are accepted."""


POLICY_FORMS = "latest:N (N >= 1), all, or specific:V[,V...] (versions >= 1)"


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's complete versions to serve."""

    kind: Literal["latest", "all", "specific"] = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def parse(cls, value: object) -> VersionPolicy:
        """`latest:N`, `all`, `specific:1,3`, or Triton's JSON form ({"latest": {"num_versions": N}},
        {"all": {}}, {"specific": {"versions": [1, 3]}})."""
        try:
            if isinstance(value, str):
                kind, _, rest = value.strip().partition(":")
                if kind == "all" and not rest:
                    return cls("all")
                if kind == "latest":
                    return cls._checked("latest", int(rest or 1), ())
                if kind == "specific":
                    return cls._checked("specific", 1, tuple(int(v) for v in rest.split(",")))
            elif isinstance(value, dict) and len(value) == 1:
                ((kind, body),) = value.items()
                body = body or {}
                if kind == "all":
                    return cls("all")
                if kind == "latest":
                    return cls._checked("latest", int(body.get("num_versions", 1)), ())
                if kind == "specific":
                    return cls._checked("specific", 1, tuple(int(v) for v in body.get("versions", [])))
        except (ValueError, TypeError, AttributeError):
            pass
        raise PolicyError(f"version policy {value!r}: expected {POLICY_FORMS}")

    @classmethod
    def _checked(
        cls, kind: Literal["latest", "specific"], count: int, versions: tuple[int, ...]
    ) -> VersionPolicy:
        if count < 1 or (kind == "specific" and (not versions or min(versions) < 1)):
            raise ValueError(kind)
        return cls(kind, count, tuple(sorted(set(versions))))

    def select(self, available: Iterable[int]) -> set[int]:
        """The versions to serve among `available` (the complete ones)."""
        present = sorted(set(available))
        if self.kind == "all":
            return set(present)
        if self.kind == "specific":
            return set(present) & set(self.versions)
        return set(present[-self.count :])

    def triton(self) -> dict[str, Any]:
        """The policy in Triton's model-configuration form."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.count}}

    def __str__(self) -> str:
        if self.kind == "all":
            return "all"
        if self.kind == "specific":
            return "specific:" + ",".join(map(str, self.versions))
        return f"latest:{self.count}"


def policy_from_config(config: str) -> VersionPolicy | None:
    """The version policy in a load call's `config` parameter (a JSON model configuration, as
    Triton's clients send it), or None when it has none."""
    try:
        document = strict_json.loads(config)
    except strict_json.JSONError as exc:
        raise PolicyError(f"the config parameter is not a JSON model configuration: {exc.message}") from None
    if not isinstance(document, dict):
        raise PolicyError("the config parameter must be a JSON object (a model configuration)")
    value = document.get("version_policy")
    return None if value is None else VersionPolicy.parse(value)


@dataclass(frozen=True)
class VersionSource:
    """One version directory as it is on disk now: its spec when complete, else why not."""

    model: str
    version: int
    path: Path
    spec: ModelSpec | None
    problem: str | None = None
    fingerprint: Fingerprint = ()

    @property
    def complete(self) -> bool:
        return self.spec is not None


@dataclass(frozen=True)
class ModelSource:
    """One model as the repository holds it: its versions and its own policy file, if any."""

    name: str
    versions: dict[int, VersionSource] = field(default_factory=dict)
    policy: VersionPolicy | None = None

    def complete_versions(self) -> list[int]:
        return sorted(v for v, source in self.versions.items() if source.complete)


def fingerprint(directory: Path) -> Fingerprint:
    """Every file below `directory` with its size and modification time: equal in two scans means
    no writer touched the directory in between."""
    entries = []
    for path in sorted(directory.rglob("*")):
        try:
            stat = path.stat()
        except OSError:  # removed while we looked: the next scan sees the change
            continue
        if path.is_file():
            entries.append((str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


def _named_files(spec: ModelSpec) -> list[str]:
    """Files a served config refers to besides the variants (read_spec checks those)."""
    config = spec.config
    names = [config.get("labels"), config.get("tokenizer"), (config.get("check") or {}).get("file")]
    return [str(n) for n in names if n]


def read_version(model: str, version: int, directory: Path) -> VersionSource:
    """A version directory: complete (config.json and every file it names), or why not."""
    print_ = fingerprint(directory)
    if not (directory / CONFIG_FILE).is_file():
        problem = f"incomplete: {directory} has no {CONFIG_FILE} yet (it is written last)"
        return VersionSource(model, version, directory, None, problem, print_)
    try:
        spec = read_spec(directory)
    except SpecError as exc:
        return VersionSource(model, version, directory, None, f"incomplete or malformed: {exc}", print_)
    if spec is None:
        problem = f"{directory / CONFIG_FILE} is not a served-model config"
        return VersionSource(model, version, directory, None, problem, print_)
    missing = [n for n in _named_files(spec) if not (directory / n).is_file()]
    if missing:
        problem = f"incomplete: {directory} lacks {missing}, which its {CONFIG_FILE} names"
        return VersionSource(model, version, directory, None, problem, print_)
    return VersionSource(model, version, directory, replace(spec, name=model), None, print_)


def _policy_file(directory: Path) -> VersionPolicy | None:
    path = directory / POLICY_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
        return VersionPolicy.parse(document["version_policy"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f'{path}: expected {{"version_policy": ...}} with {POLICY_FORMS} ({exc})') from None


def _version_dirs(directory: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(p.name), p) for p in directory.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    )


def scan(repository: Path) -> dict[str, ModelSource]:
    """Every model of the repository with its versions, in directory order (SpecError when the
    repository is missing, two models share a name, or a policy file is unreadable)."""
    if not repository.is_dir():
        raise SpecError(f"model repository {repository} does not exist or is not a directory")
    models: dict[str, ModelSource] = {}

    def add(source: ModelSource) -> None:
        if source.name in models:
            raise SpecError(f"two served models are named {source.name!r} in {repository}")
        models[source.name] = source

    flat = read_spec(repository)
    if flat is not None:  # the repository is itself one export
        add(ModelSource(flat.name, {FLAT_VERSION: read_version(flat.name, FLAT_VERSION, repository)}))
        return models
    for directory in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        spec = read_spec(directory)
        if spec is not None:
            add(ModelSource(spec.name, {FLAT_VERSION: read_version(spec.name, FLAT_VERSION, directory)}))
            continue
        numbered = _version_dirs(directory)
        if numbered:
            name = directory.name
            versions = {v: read_version(name, v, path) for v, path in numbered}
            add(ModelSource(name, versions, _policy_file(directory)))
    return models


def require_sources(repository: Path) -> dict[str, ModelSource]:
    """`scan`, refusing a repository without any complete version (the message says what to do)."""
    models = scan(repository)
    if not any(m.complete_versions() for m in models.values()):
        problems = [s.problem for m in models.values() for s in m.versions.values() if s.problem]
        raise SpecError(
            f"no served models (directories with a {SERVED_FORMAT} config.json: NAME/ or its "
            f"versions NAME/1/, NAME/2/...) in {repository}; create one with "
            f"`{export_command(Path('CHECKPOINT_DIR'), repository / 'NAME')}`"
            + (f"; {'; '.join(problems)}" if problems else "")
        )
    return models


__all__ = [
    "VersionPolicy",
    "PolicyError",
    "VersionSource",
    "ModelSource",
    "policy_from_config",
    "fingerprint",
    "read_version",
    "scan",
    "require_sources",
    "POLICY_FILE",
    "POLICY_FORMS",
]
