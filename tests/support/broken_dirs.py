"""Broken model directories, as a hostile or careless writer leaves them in a repository: each
maker puts one into `repo` (from a good export), with the words the reason it is listed with must
contain. Shared by the scan's tests and the servers' (tests/service/v2/test_repository_hostile.py).
Copies are hard links: the same bytes and tree, at once; a file a maker changes is unlinked first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterable
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


def special_file(name: str, directory: str, *, size: int | None = None, **config: object) -> Maker:
    """A version whose file `name` is a FIFO (a writer that never writes: reading it would block
    for good), or, with `size`, a sparse regular file of that many bytes (its size costs no disk);
    `config` changes its config.json (None removes a key), e.g. to fall back to a default file."""

    def make(repo: Path, good: Path) -> None:
        target = copy_export(good, repo / directory / "1")
        if config:
            changed = read_config(target) | config
            write_config(target, {k: v for k, v in changed.items() if v is not None})
        path = target / name
        path.unlink(missing_ok=True)  # a hard link: never write through it
        if size is None:
            os.mkfifo(path)
        else:
            with path.open("wb") as handle:
                handle.truncate(size)

    return make


def outcome_within(call: Callable[[], object], seconds: float) -> BaseException | None:
    """What `call` raised (None: it returned), run in a daemon thread; AssertionError when it has
    not ended within `seconds` (it blocked: the thread is left behind, see `release_readers`)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]


def release_readers(fifos: Iterable[Path]) -> None:
    """Open each FIFO for writing once and close it: a reader left blocked in open() by a test that
    failed gets its end of file and goes."""
    for path in fifos:
        with contextlib.suppress(OSError):  # no reader waits (ENXIO), or the FIFO is gone
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _policy_fifo(repo: Path, good: Path) -> None:
    copy_export(good, repo / "fifo-policy" / "1")
    os.mkfifo(repo / "fifo-policy" / "policy.json")


FIFO = "a FIFO, not a regular file"
OVER_BOUND = "larger than its bound"
# A classifier's copy turned masked LM (the scan reads no graph): its tokenizer.json is read.
AS_MLM: dict[str, object] = {"task": "fill-mask", "labels": None}

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
    "card a FIFO": (special_file("README.md", "fifo-card"), FIFO),
    "default labels a FIFO": (special_file("labels.json", "fifo-labels", labels=None), FIFO),
    "tokenizer a FIFO": (special_file("tokenizer.json", "fifo-tokenizer", **AS_MLM), FIFO),
    "check a FIFO": (special_file("check.npz", "fifo-check"), FIFO),
    "variant a FIFO": (special_file("model.onnx", "fifo-variant"), FIFO),
    "config a FIFO": (special_file("config.json", "fifo-config"), FIFO),
    "policy a FIFO": (_policy_fifo, FIFO),
    "card of 400 MiB": (special_file("README.md", "big-card", size=400 << 20), OVER_BOUND),
    "labels of 5 MiB": (special_file("labels.json", "big-labels", size=5 << 20), OVER_BOUND),
    "tokenizer of 17 MiB": (
        special_file("tokenizer.json", "big-tokenizer", size=17 << 20, **AS_MLM),
        OVER_BOUND,
    ),
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
    "special_file",
    "outcome_within",
    "release_readers",
]
