"""`gmlp` console script. Subcommands live next to what they drive; each module registers its own.

Heavy imports (torch, onnxruntime) happen inside the handlers, so `gmlp serve` and `gmlp --help`
work in the serving image, which has no torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# module, registering function: each adds one or more subcommands with `set_defaults(handler=...)`
_REGISTRARS = [
    ("gmlp.model_commands", "register"),
    ("gmlp.export_commands", "register"),
    ("gmlp.train_commands", "register"),
    ("service.cli", "register"),
    ("loadtests.cli", "register"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmlp", description="Train, export, serve and load-test gMLP models.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, func in _REGISTRARS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that part of the project is not installed in this image
            raise
        getattr(module, func)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        # Our own errors (CheckpointError, ExportError, ...) are ValueErrors with a full message.
        print(f"gmlp {args.command}: error: {exc}", file=sys.stderr)
        return 1
