"""`gmlp` console script. Subcommands live next to what they drive; each module registers its own.

Heavy imports (torch, onnxruntime) happen inside the handlers, so `gmlp serve` and `gmlp --help`
work in the serving image, which has no torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from contract.errors import UserError

# Each module adds its subcommands in `register(sub)` with `set_defaults(handler=...)`; beside it,
# the pip extra it needs.
_COMMAND_MODULES = {
    "gmlp.model_commands": "export",
    "gmlp.train_commands": "train",
    "gmlp.serve_command": "serve",
    "loadtests.cli": "loadtest",
    "gmlp.tune.command": "serve",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gmlp", description="Train, export, serve and load-test gMLP models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    missing = []
    for module_name, extra in _COMMAND_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # That part of the project, or a dependency of it, is not installed in this image.
            missing.append(f"{module_name} (needs {exc.name}: pip install 'gmlp-serve[{extra}]')")
            continue
        module.register(sub)
    if missing:
        parser.epilog = "not available here: " + "; ".join(missing)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (UserError, FileNotFoundError) as exc:
        # What the user handed us cannot be used (CheckpointError, ExportCheckError, SpecError...):
        # the message says why and how to fix it; anything else is a bug and keeps its traceback.
        return _error(args.command, str(exc))
    except MemoryError:
        # Not a bug but a limit (the inputs are checked against memory where their sizes are
        # known): one line, as for the user's errors, rather than a traceback that itself fails.
        return _error(args.command, "out of memory: this needs more than the memory limit (ulimit -v) allows")


def _error(command: str, message: str) -> int:
    """Print `message` as the one line `gmlp <command>: error: ...` (a message quoting a file or a
    library's text may hold line breaks: they become spaces) and return the exit status, 1."""
    print(f"gmlp {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 1
