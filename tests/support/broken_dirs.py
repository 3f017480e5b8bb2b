"""Broken model directories, as a hostile or careless writer leaves them in a repository: each
maker puts one into `repo` (from a good export), with the words the reason it is listed with must
contain. Shared by the scan's tests and the servers' (tests/service/v2/test_repository_hostile.py).
Copies are hard links: the same bytes and tree, at once; a file a maker changes is unlinked first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.formats import CONFIG_FILE

Maker = Callable[[Path, Path], None]


def copy_export(source: Path, target: Path) -> Path:
    """A copy of an export made of hard links (same bytes, same directory tree, instant)."""
    shutil.copytree(source, target, copy_function=os.link)
    return target


def read_config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / CONFIG_FILE).read_text())


def write_config(directory: Path, config: object) -> None:
    (directory / CONFIG_FILE).unlink()  # a hard link: never write through it
    (directory / CONFIG_FILE).write_text(json.dumps(config))


# -- what a hostile writer can put in the repository: (make(repo, good export), expected reason) ----


def raw_config(data: bytes, directory: str = "raw") -> Maker:
    def make(repo: Path, good: Path) -> None:
        copy_export(good, repo / directory)
        (repo / directory / CONFIG_FILE).unlink()
        (repo / directory / CONFIG_FILE).write_bytes(data)

    return make


def config_field(key: str, value: object) -> Maker:
    def make(repo: Path, good: Path) -> None:
        target = copy_export(good, repo / "field")
        config = read_config(target)
        config["name"] = "field"
        if isinstance(config.get(key), dict) and isinstance(value, dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
        write_config(target, config)

    return make


def version_named(name: str | bytes) -> Maker:
    def make(repo: Path, good: Path) -> None:
        model = repo / "odd-versions"
        model.mkdir(exist_ok=True)
        target = os.path.join(os.fsencode(model), name if isinstance(name, bytes) else os.fsencode(name))
        shutil.copytree(good, os.fsdecode(target), copy_function=os.link)

    return make


def _outside_link(key: str) -> Maker:
    """The config names a file that is a symlink to a file outside the model's directory."""

    def make(repo: Path, good: Path) -> None:
        target = copy_export(good, repo / "linked" / "1")
        secret = repo.parent / "secret.json"
        secret.write_text('["not", "yours"]')
        (target / "outside.json").symlink_to(secret)
        config = read_config(target)
        if key == "check":
            config["check"] = {**config.get("check", {}), "file": "outside.json"}
        else:
            config[key] = "outside.json"
        write_config(target, config)

    return make


def _symlink_loop(repo: Path, good: Path) -> None:
    (repo / "loop").mkdir()
    (repo / "loop" / "1").symlink_to(repo / "loop" / "1")
    (repo / "loopy").symlink_to(repo / "loopy")
    target = copy_export(good, repo / "good-self-linked" / "1")  # still a good version
    (target / "self").symlink_to(target)  # a directory link inside a version: not descended into


def _file_for_directory(repo: Path, good: Path) -> None:
    (repo / "filed").mkdir()
    (repo / "filed" / "1").write_text("a file where version 1's directory belongs")
    (repo / "plainfile").write_text("a file at the repository's top")


def _duplicate_flat(repo: Path, good: Path) -> None:
    for directory in ("twin-a", "twin-b"):
        write_config(copy_export(good, repo / directory), read_config(good) | {"name": "twin"})


def _missing_model(repo: Path, good: Path) -> None:
    target = copy_export(good, repo / "hollow")
    for variant in read_config(good)["variants"].values():
        (target / variant).unlink()


def _not_utf8_name(repo: Path, good: Path) -> None:
    shutil.copytree(good, os.fsdecode(os.fsencode(repo) + b"/bad-\xff\xfe/1"), copy_function=os.link)


def policy_file(text: bytes) -> Maker:
    def make(repo: Path, good: Path) -> None:
        copy_export(good, repo / "ruled" / "1")
        (repo / "ruled" / "policy.json").write_bytes(text)

    return make


BROKEN: dict[str, tuple[Maker, str]] = {
    "config not UTF-8": (raw_config(b'{"format": "\xff\xfe"}'), "unreadable config"),
    "config not JSON": (raw_config(b"{not json", "notjson"), "unreadable config"),
    "config nested deep": (raw_config(b"[" * 100_000 + b"]" * 100_000, "deep"), "unreadable config"),
    "config too large": (raw_config(b" " * (2 << 20), "big"), "larger than"),
    "variants a list": (config_field("variants", ["model.onnx"]), "must be a JSON object"),
    "name with a newline": (config_field("name", "a\nCRITICAL forged"), "printable"),
    "name a list": (config_field("name", ["x"]), "model name"),
    "labels absolute": (config_field("labels", "/etc/passwd"), "inside the model's directory"),
    "labels dot-dot": (config_field("labels", "../tiny-mlm/config.json"), "inside the model's directory"),
    "tokenizer dot-dot": (config_field("tokenizer", "a/../../x.json"), "inside the model's directory"),
    "variant absolute": (config_field("variants", {"fp32": "/dev/zero"}), "inside the model's directory"),
    "check absolute": (config_field("check", {"file": "/etc/hostname"}), "inside the model's directory"),
    "labels linked out": (_outside_link("labels"), "outside the model's directory"),
    "tokenizer linked out": (_outside_link("tokenizer"), "outside the model's directory"),
    "check linked out": (_outside_link("check"), "outside the model's directory"),
    "version superscript": (version_named("²"), "ignored: a version directory is named by"),
    "version leading zero": (version_named("01"), "ignored"),
    "version arabic-indic": (version_named("٣"), "ignored"),
    "version signed": (version_named("+1"), "ignored"),
    "version huge": (version_named("9" * 40), "ignored"),
    "version not UTF-8": (version_named(b"\xff1"), "ignored"),
    "symlink loops": (_symlink_loop, ""),
    "file for directory": (_file_for_directory, "not one"),
    "duplicate flat names": (_duplicate_flat, "2 directories claim the model name 'twin'"),
    "flat without model file": (_missing_model, "variant files missing"),
    "name not UTF-8": (_not_utf8_name, "printable"),
    "policy not UTF-8": (policy_file(b'{"version_policy": "\xff"}'), "policy.json"),
    "policy superscript": (policy_file(b'{"version_policy": "specific:\xc2\xb2"}'), "policy.json"),
    "policy unicode digit": (policy_file('{"version_policy": "latest:٣"}'.encode()), "policy.json"),
}


__all__ = [
    "BROKEN",
    "Maker",
    "copy_export",
    "read_config",
    "write_config",
    "raw_config",
    "config_field",
    "version_named",
    "policy_file",
]
