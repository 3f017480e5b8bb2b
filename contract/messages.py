"""How a client's text appears in messages and log lines: on one line, and short.

An error message repeats what a client sent (a model name, a version, a field), and a log line
repeats the message; a value with a line break could forge a stand-alone log line, and a megabyte
of name would make a megabyte of error (over gRPC, a RESOURCE_EXHAUSTED instead of the NOT_FOUND it
deserves). So every quoted value goes through `echo`, every message through `escape_controls` and
`shorten` (`contract.errors.RequestError` does it), and the text log through `escape_controls`.
"""

from __future__ import annotations

import re

# Characters that end or break a line somewhere (a terminal, a log shipper, str.splitlines): C0
# controls, DEL, C1 controls, and the Unicode line and paragraph separators.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The most characters of a client's value that a message echoes, and the most characters of a
# whole message (its own text and the lists it names included).
ECHO_LIMIT = 200
MESSAGE_LIMIT = 2000


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """`text` with every control character written as a Python escape (`\\n`, `\\x1b`, `\\u2028`), so
    that it stays on one line wherever it is written."""
    return CONTROL_CHARACTERS.sub(_escape, text)


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with a marker that says how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """A client's value as a message quotes it: its first `limit` characters, quoted and escaped
    as `repr` writes a string, with its length when it was cut. Every message that repeats what a
    client sent goes through this, so no value makes an error long or breaks a line."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
