"""`gmlp keys new NAME SCOPES [rate=R] [burst=B]`: a new API key and its line for the keys file.

The key is printed once and never stored; the line holds only its digest (docs/security.md).
"""

from __future__ import annotations

import argparse

from contract.errors import UserError
from service.access.keys import key_line, new_key, parse_keys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="make API keys for GMLP_API_KEYS_FILE")
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="print a new random key (256 bits) and its keys-file line")
    new.add_argument("name", help="the key's name (in logs and metrics; never the key itself)")
    new.add_argument("scopes", help="comma-separated scopes: infer, metrics, admin")
    new.add_argument("options", nargs="*", metavar="OPTION", help="rate=R (requests/s), burst=B")
    new.set_defaults(handler=_new)


def _new(args: argparse.Namespace) -> int:
    key = new_key()
    line = key_line(args.name, args.scopes, key, *args.options)
    try:
        parse_keys(line, "the new line")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(f"key (give it to the client; it is not stored): {key}")
    print(f"line for GMLP_API_KEYS_FILE:\n{line}")
    return 0
