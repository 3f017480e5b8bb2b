"""What the model repository holds on disk: models, their versions, and what is wrong with either.

Two layouts, side by side in one repository (Triton's, and the flat one of a single export):

    models/NAME/1/config.json ...   versioned: each version directory is one exported version
    models/NAME/config.json ...     flat: the export itself is version 1

The model's name is the directory's name in the versioned layout, the config's `name` in the flat
one; names starting with a dot are hidden (staging copies). A version directory is named by
`parse_version` and is *complete* when its `config.json` and every file the config names are
there, inside it (docs/service.md, "Model versions and the repository API", says when and how to
write one); `fingerprint` lets the poller also wait until a directory looks the same in two scans
`GMLP_REPOSITORY_POLL_S` apart.

Whoever writes to the repository can put anything there, so `scan` reads each directory in
isolation and never raises for one (only for a repository that is missing or cannot be listed):
what it cannot read is a `VersionSource` or `ModelSource` with a `problem` (nothing of a model
with one loads or unloads until it is fixed), and entries of a model directory that are not
versions are its `notes`. The service lists every problem and note as UNAVAILABLE with its reason
(the docs' table of broken directories). Nothing here loads a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from contract.formats import CONFIG_FILE, SERVED_FORMAT
from contract.limits import MAX_POLICY_BYTES
from contract.messages import echo
from contract.repository import (
    POLICY_FILE,
    POLICY_FORMS,
    VERSION_FORM,
    VersionError,
    VersionPolicy,
    parse_version,
)
from contract.spec import ModelSpec, SpecError, export_command, model_name_problem, read_json, read_spec

FLAT_VERSION = 1
MAX_REASON_CHARS = 1000

Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class VersionSource:
    """One version directory as it is on disk now: its spec when complete, else why not."""

    model: str
    version: int
    path: Path
    spec: ModelSpec | None
    problem: str | None = None
    fingerprint: Fingerprint = ()


@dataclass(frozen=True)
class ModelSource:
    """One model as the repository holds it: its versions, its own policy file if any, and what
    keeps it from being applied (`problem`) or was ignored in its directory (`notes`)."""

    name: str
    versions: dict[int, VersionSource] = field(default_factory=dict)
    policy: VersionPolicy | None = None
    problem: str | None = None
    notes: tuple[str, ...] = ()

    def complete_versions(self) -> list[int]:
        return sorted(v for v, source in self.versions.items() if source.spec is not None)

    def problems(self) -> tuple[str, ...]:
        """The model-level reasons to list (the versions carry their own)."""
        return ((self.problem,) if self.problem else ()) + self.notes


def fingerprint(directory: Path) -> Fingerprint:
    """Every file below `directory` with its size and modification time: equal in two scans means
    no writer touched the directory in between. Symlinked directories are not descended into."""
    entries = []
    for path in sorted(directory.rglob("*")):
        try:
            stat = path.stat()
        except OSError:  # removed while we looked, or a dangling link: the next scan sees the change
            continue
        if path.is_file():
            entries.append((str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


def _unreadable(exc: BaseException) -> str:
    return f"unreadable: {type(exc).__name__}: {echo(str(exc), 300)}"


def read_version(model: str, version: int, directory: Path) -> VersionSource:
    """A version directory: complete (config.json and every file it names), or why not; never
    raises for what is on disk."""
    try:
        print_ = fingerprint(directory)
        spec, problem = _read_spec(directory)
    except Exception as exc:  # anything a hostile directory makes the reading raise
        return VersionSource(model, version, directory, None, _unreadable(exc))
    return VersionSource(model, version, directory, spec and replace(spec, name=model), problem, print_)


def _read_spec(directory: Path) -> tuple[ModelSpec | None, str | None]:
    """A version directory's spec when it is complete, else (None, why not)."""
    if not (directory / CONFIG_FILE).exists():  # a FIFO or the like is read_spec's to refuse
        return None, f"incomplete: {directory} has no {CONFIG_FILE} yet (it is written last)"
    try:
        spec = read_spec(directory)
    except SpecError as exc:
        return None, f"incomplete or malformed: {exc}"
    if spec is None:
        return None, f"{directory / CONFIG_FILE} is not a served-model config"
    # The files the config names besides the variants (read_spec checks those).
    config = spec.config
    named = [config.get("labels"), config.get("tokenizer"), (config.get("check") or {}).get("file")]
    missing = [str(n) for n in named if n and not (directory / str(n)).exists()]
    if missing:
        return None, f"incomplete: {directory} lacks {missing}, which its {CONFIG_FILE} names"
    return spec, None


def _versioned(name: str, directory: Path) -> ModelSource:
    """A versioned model directory: its versions, and notes on what is not a version."""
    versions: dict[int, VersionSource] = {}
    notes = []
    for child in sorted(directory.iterdir()):
        if child.name.startswith(".") or child.name == POLICY_FILE:
            continue
        try:
            number = parse_version(child.name)
        except VersionError:
            if child.is_dir():
                notes.append(
                    f"directory {echo(child.name)} ignored: a version directory is named by {VERSION_FORM}"
                )
            continue
        if not child.is_dir():
            notes.append(f"{echo(child.name)} ignored: a version is a directory, this is not one")
            continue
        versions[number] = read_version(name, number, child)
    path = directory / POLICY_FILE
    policy: VersionPolicy | None = None
    if path.exists():  # read as a regular file only: a FIFO is a problem, not a wait
        try:
            policy = VersionPolicy.parse(read_json(path, MAX_POLICY_BYTES, "policy")["version_policy"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            problem = f'{path}: expected {{"version_policy": ...}} with {POLICY_FORMS} ({exc})'
            return ModelSource(
                name,
                versions,
                None,
                f"{problem}; nothing of the model changes until it is fixed",
                tuple(notes),
            )
    return ModelSource(name, versions, policy, None, tuple(notes))


def _model_dir(directory: Path) -> ModelSource | None:
    """The model a directory of the repository holds (None: it holds none, such as an empty one)."""
    name_problem = model_name_problem(directory.name)
    flat_problem: str | None = None
    try:
        spec = read_spec(directory)
    except SpecError as exc:
        spec, flat_problem = None, str(exc)
    if spec is not None:
        return ModelSource(spec.name, {FLAT_VERSION: read_version(spec.name, FLAT_VERSION, directory)})
    if name_problem is not None:
        return ModelSource(echo(directory.name), problem=f"directory ignored: {name_problem}")
    model = _versioned(directory.name, directory)
    if flat_problem is not None and not model.versions:  # a flat export that cannot be read
        return ModelSource(
            directory.name, {FLAT_VERSION: read_version(directory.name, FLAT_VERSION, directory)}
        )
    if flat_problem is not None:
        model = replace(model, notes=(f"{CONFIG_FILE} ignored: {flat_problem}", *model.notes))
    return model if model.versions or model.problems() else None


def _reason(text: str) -> str:
    """A reason as every transport can send it: bounded, and valid UTF-8 (a name that is not comes
    back from the file system with surrogates, which JSON encoders and protobuf refuse)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _isolated(directory: Path) -> ModelSource | None:
    try:
        source = _model_dir(directory)
    except Exception as exc:  # one directory never breaks the scan of the others
        source = ModelSource(echo(directory.name), problem=f"directory {_unreadable(exc)}")
    if source is None:
        return None
    versions = {
        n: replace(v, problem=_reason(v.problem)) if v.problem else v for n, v in source.versions.items()
    }
    problem = _reason(source.problem) if source.problem else None
    return replace(source, versions=versions, problem=problem, notes=tuple(map(_reason, source.notes)))


def scan(repository: Path) -> dict[str, ModelSource]:
    """Every model of the repository with its versions, in directory order; SpecError only when
    the repository itself is missing or cannot be listed (see the module docstring)."""
    if not repository.is_dir():
        raise SpecError(f"model repository {repository} does not exist or is not a directory")
    if (repository / CONFIG_FILE).is_file():  # the repository is itself one export
        flat = _isolated(repository)
        return {flat.name: flat} if flat is not None else {}
    try:
        entries = sorted(p for p in repository.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise SpecError(f"model repository {repository} cannot be listed: {exc}") from None
    claims: dict[str, list[tuple[Path, ModelSource]]] = {}
    for directory in entries:
        if directory.is_dir():
            source = _isolated(directory)
            if source is not None:
                claims.setdefault(source.name, []).append((directory, source))
    models = {}
    for name, claimed in claims.items():
        if len(claimed) == 1:
            models[name] = claimed[0][1]
            continue
        where = ", ".join(echo(d.name) for d, _ in claimed)
        models[name] = ModelSource(
            name,
            problem=f"{len(claimed)} directories claim the model name {echo(name)}: {where}; rename or "
            "remove one (nothing of the model loads or unloads until then)",
        )
    return models


def problems_of(sources: dict[str, ModelSource], *, notes: bool = True) -> list[str]:
    """Every reason a scan found, model-level and per version, as log lines, in repository order;
    without `notes`, only those that keep a model or version from being served (not what was
    ignored beside them)."""
    found = [
        f"model {name}: {p}"
        for name, source in sources.items()
        for p in (source.problems() if notes else (source.problem,) if source.problem else ())
    ]
    return found + [
        f"model {name} version {v}: {s.problem}"
        for name, source in sources.items()
        for v, s in source.versions.items()
        if s.problem
    ]


def require_sources(repository: Path, *, every_model: bool = False) -> dict[str, ModelSource]:
    """`scan`, refusing a repository without any complete version (the message says what to do).

    With `every_model`, any model or version the scan could not read is refused too: a repository
    read once at start-up (`model_control=none`) would never serve it, and a replica without one of
    its models must not come up looking healthy (docs/reliability.md, "Two behaviours chosen");
    the watched modes list such a directory UNAVAILABLE instead and serve the rest."""
    models = scan(repository)
    problems = problems_of(models)
    if not any(m.complete_versions() for m in models.values()):
        raise SpecError(
            f"no served models (directories with a {SERVED_FORMAT} config.json: NAME/ or its "
            f"versions NAME/1/, NAME/2/...) in {repository}; create one with "
            f"`{export_command(Path('CHECKPOINT_DIR'), repository / 'NAME')}`"
            + (f"; {'; '.join(problems)}" if problems else "")
        )
    unservable = problems_of(models, notes=False) if every_model else []
    if unservable:
        raise SpecError(
            f"the model repository {repository} holds models that cannot be served: {'; '.join(unservable)}"
        )
    return models
