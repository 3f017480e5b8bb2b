"""`gmlp serve`, which exports demo checkpoints whose served directory is missing, then serves;
and `gmlp keys new NAME SCOPES [rate=R] [burst=B]`, a new API key and its line for the keys file.

This closes the gap between training and serving on a developer machine: a checkpoint under
`GMLP_CHECKPOINT_DIR` (default `checkpoints/`) without a directory of the same name in the model
repository is exported first (fp32 + int8) when torch is importable; otherwise start-up stops with
the exact command to run on a machine that has it. The service itself only reads served-model
directories (it imports neither `model` nor `export`). A new key is printed once and never stored;
its line holds only its digest (docs/security.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from pathlib import Path

from contract.errors import UserError
from contract.formats import DEFAULT_EXPORT_VARIANTS
from contract.spec import SpecError, export_command, is_checkpoint
from service.access.keys import key_line, new_key, parse_keys
from service.cli import add_serve_arguments, run_serve
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


def _exporter_problem() -> str | None:
    """Why gmlp-serve's `export` package cannot run here, or None when it can.

    `export` is a common module name: whatever comes first on sys.path under that name is imported
    and must be ours, recognised by the entry point only it has, before anything is exported.
    """
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    try:
        module = importlib.import_module("export")
    except ImportError as exc:
        return f"gmlp-serve's export package does not import: {exc}"
    if not callable(getattr(module, "export_served_model", None)):
        where = getattr(module, "__file__", None) or "an unknown location"
        return f"the module named 'export' found first ({where}) is not gmlp-serve's export package"
    return None


def export_missing(
    checkpoint_dir: Path | None, repository: Path, variants: tuple[str, ...] = DEFAULT_EXPORT_VARIANTS
) -> list[Path]:
    """Export every checkpoint in `checkpoint_dir` whose served directory `repository/<name>` is missing
    and return the directories written; without torch, a SpecError names the commands to run."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return []
    todo = [
        (ckpt, repository / ckpt.name)
        for ckpt in sorted(p for p in checkpoint_dir.iterdir() if p.is_dir() and is_checkpoint(p))
        if not (repository / ckpt.name / "config.json").is_file()
    ]
    if not todo:
        return []
    missing = _exporter_problem()
    if missing is not None:
        commands = "; ".join(export_command(c, o) for c, o in todo)
        raise SpecError(f"checkpoints without an exported served model ({missing}): run {commands}")
    from export import export_served_model  # torch-side code, imported only when needed

    repository.mkdir(parents=True, exist_ok=True)
    for ckpt, out_dir in todo:
        log.info("exporting checkpoint %s -> %s (variants %s)", ckpt, out_dir, ", ".join(variants))
        export_served_model(ckpt, out_dir, variants=list(variants))
    return [out_dir for _, out_dir in todo]


def _prepare(settings: ServiceSettings) -> None:
    export_missing(settings.checkpoint_dir, settings.model_repository)


def run(args: argparse.Namespace) -> int:
    return run_serve(args, prepare=_prepare)


def _new_key(args: argparse.Namespace) -> None:
    key = new_key()
    line = key_line(args.name, args.scopes, key, *args.options)
    try:
        parse_keys(line, "the new line")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(f"key (give it to the client; it is not stored): {key}")
    print(f"line for GMLP_API_KEYS_FILE:\n{line}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `serve` and `keys` to the `gmlp` console script (gmlp/cli.py)."""
    parser = sub.add_parser(
        "serve",
        help="serve the models of a model repository over HTTP",
        description="Serve gMLP models over HTTP: /classify, /fill-mask, /health/*, /models, /metrics, /v2. "
        "Checkpoints without a served directory are exported first (needs torch).",
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=run)
    keys = sub.add_parser("keys", help="make API keys for GMLP_API_KEYS_FILE")
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="print a new random key (256 bits) and its keys-file line")
    new.add_argument("name", help="the key's name (in logs and metrics; never the key itself)")
    new.add_argument("scopes", help="comma-separated scopes: infer, metrics, admin")
    new.add_argument("options", nargs="*", metavar="OPTION", help="rate=R (requests/s), burst=B")
    new.set_defaults(handler=_new_key)
