"""API keys for tests: write a keys file (`GMLP_API_KEYS_FILE`) and get the keys it holds.

    keys = write_keys(tmp_path / "keys", admin="admin", client="infer rate=5 burst=5")
    server = start_server(api_keys_file=tmp_path / "keys")
    httpx.post(url, headers=bearer(keys["client"]))

Each value is the key's scopes (comma-separated) and, optionally, its options; the file holds only
the keys' digests, as in production. The file is replaced atomically (a new inode), as a Secret
volume or `mv` would replace it, so that a running server sees one consistent version.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.access.keys import key_line, new_key


def keys_file_text(keys: dict[str, str], scopes: dict[str, str]) -> str:
    """The keys file's lines for `keys` (name -> key) with `scopes` (name -> "SCOPES [options]")."""
    lines = ["# name scopes digest [options]"]
    for name, key in keys.items():
        scope_list, *options = scopes[name].split()
        lines.append(key_line(name, scope_list, key, *options))
    return "\n".join(lines) + "\n"


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_keys(path: Path, **scopes: str) -> dict[str, str]:
    """Write a keys file with one new key per name (`name="SCOPES [options]"`); the keys by name."""
    keys = {name: new_key() for name in scopes}
    replace_file(path, keys_file_text(keys, scopes))
    return keys


def bearer(key: str) -> dict[str, str]:
    """The headers that present `key` as most clients do."""
    return {"Authorization": f"Bearer {key}"}


__all__ = ["write_keys", "bearer", "keys_file_text", "replace_file"]
