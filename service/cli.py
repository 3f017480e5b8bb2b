"""Serving flags generated from `ServiceSettings`, so flags, env vars and docs never drift.

`add_serve_arguments(parser)` adds one `--flag` per setting (default None, meaning "use the
environment or the built-in default"); `settings_from_args(args)` applies the flags on top of
`GMLP_*`; `serve(settings)` checks the repository and runs the service (`service.server`). The
`gmlp serve` subcommand (gmlp/serve_command.py) adds the start-up export of missing demo
checkpoints on top; `python -m service.cli` serves what the repository holds.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic.fields import FieldInfo

from contract.errors import UserError
from service.settings import Group, ServiceSettings, group_of
from service.telemetry.logs import configure_logging

log = logging.getLogger(__name__)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _choices(annotation: Any) -> list[str] | None:
    """argparse `choices` for a settings annotation: a Literal's values (also inside Optional).
    Every flag's value is a string, which pydantic converts (paths, numbers, booleans)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _choices(args[0])
    return [str(a) for a in args] if origin is typing.Literal else None


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add a flag for every `ServiceSettings` field (e.g. --max-batch-size for GMLP_MAX_BATCH_SIZE),
    one argument group per settings group."""
    groups = {group: parser.add_argument_group(f"{group.heading} settings", group.about) for group in Group}
    for name, field in ServiceSettings.model_fields.items():
        choices = _choices(field.annotation)
        help_text = f"{_described(field)} [env {_env(name)}; default {_default(field)}]".replace("%", "%%")
        group = groups[group_of(field)]
        if field.annotation is bool:  # --jpeg-draft / --no-jpeg-draft
            options: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
        else:
            options = {"choices": choices, "metavar": None if choices else name.upper()}
        group.add_argument(_flag(name), dest=f"serve_{name}", default=None, help=help_text, **options)
    return parser


def _env(name: str) -> str:
    return f"GMLP_{name.upper()}"


def _described(field: FieldInfo) -> str:
    """The field's docstring (service/settings.py) on one line."""
    return " ".join((field.description or "").split())


def _default(field: FieldInfo) -> str:
    """A default as an operator writes it: `true`, `models`, `(unset)` (the description says what then)."""
    if field.default is None:
        return "(unset)"
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


def _flags(name: str, field: FieldInfo) -> str:
    flag = _flag(name)
    return f"`{flag}` / `--no-{flag[2:]}`" if field.annotation is bool else f"`{flag}`"


# Around the generated tables in docs/service.md (scripts/settings_docs.py rewrites what is between).
SETTINGS_BEGIN = "<!-- settings tables: generated from service/settings.py by `make settings-docs` -->"
SETTINGS_END = "<!-- end of the generated settings tables -->"


def settings_tables() -> str:
    """docs/service.md's settings tables, one per group, from the fields (scripts/settings_docs.py)."""
    parts = []
    for group in Group:
        rows = [
            f"| `{_env(name)}` | {_flags(name, field)} | `{_default(field)}` | {_described(field)} |"
            for name, field in ServiceSettings.model_fields.items()
            if group_of(field) is group
        ]
        header = f"### {group.heading}\n\n{group.about}.\n\n"
        parts.append(
            header + "| variable | flag | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def settings_from_args(args: argparse.Namespace) -> ServiceSettings:
    """`ServiceSettings` from the environment, overridden by the flags that were given."""
    overrides = {
        name: value
        for name in ServiceSettings.model_fields
        if (value := getattr(args, f"serve_{name}", None)) is not None
    }
    return ServiceSettings(**overrides)


def serve(settings: ServiceSettings) -> None:
    """Check the repository, then run the service in the foreground until SIGINT/SIGTERM (then drain
    and exit)."""
    from contract.scan import require_sources, scan
    from service.server import serve as run

    # Fail fast, before listening: a missing or empty repository is a configuration error the
    # operator must see at once, not a pod that never becomes ready.
    # In explicit mode an empty repository is fine: models arrive through the repository API.
    # Read once (model control none), every model must be sound; watched, broken directories are
    # listed UNAVAILABLE and the rest served.
    if settings.model_control == "explicit":
        models = scan(settings.model_repository)
    else:
        models = require_sources(settings.model_repository, every_model=settings.model_control == "none")
    log.info("serving %s from %s", ", ".join(sorted(models)), settings.model_repository)
    run(settings)


def run_serve(args: argparse.Namespace, prepare: Callable[[ServiceSettings], None] | None = None) -> int:
    """Settings from `args`, `prepare(settings)` if given, then serve: returns the exit status."""
    from pydantic import ValidationError

    try:
        settings = settings_from_args(args)
        # First, so that every line from here on (the start-up export included) is in the format.
        configure_logging(settings)
        if prepare is not None:
            prepare(settings)
        serve(settings)
    except ValidationError as exc:
        print(f"gmlp serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"gmlp serve: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m service.cli [flags]`: serve the repository as it is."""
    parser = add_serve_arguments(
        argparse.ArgumentParser(prog="gmlp serve", description="Serve gMLP models over HTTP")
    )
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
