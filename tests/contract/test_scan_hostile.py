"""The repository scan against directories nobody should have written: each broken directory is
listed with its reason, never an exception, and the good models beside it are found as if it were
not there. Generated (hypothesis) and by name: config.json bytes and JSON of every kind, version
directory names of every alphabet, duplicate names, missing and outside files, symlink loops,
files where directories belong, names that are not UTF-8."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.repository import MAX_VERSION_DIGITS, VersionError, parse_version
from contract.scan import MAX_REASON_CHARS, ModelSource, scan
from support.broken_dirs import (
    BROKEN,
    Maker,
    config_field,
    copy_export,
    policy_file,
    raw_config,
    read_config,
    version_named,
    write_config,
)


def _sendable(sources: dict[str, ModelSource]) -> None:
    """Every name and reason a scan produced can go out in a JSON body, a gRPC string, a log line."""
    for name, source in sources.items():
        texts = [name, *source.problems(), *(v.problem or "" for v in source.versions.values())]
        for text in texts:
            text.encode("utf-8")  # no lone surrogates from a name that is not UTF-8
            assert len(text) <= MAX_REASON_CHARS + 300


def _good_repository(repo: Path, vision: Path, mlm: Path) -> dict[str, list[int]]:
    """Good models in both layouts, and the complete versions each must be found with."""
    copy_export(vision, repo / "good-vision" / "1")
    copy_export(vision, repo / "good-vision" / "3")
    write_config(copy_export(mlm, repo / "flat-mlm"), read_config(mlm) | {"name": "good-mlm"})
    return {"good-vision": [1, 3], "good-mlm": [1]}


def _scan_with(repo: Path, vision: Path, mlm: Path, breakers: list[Maker]) -> Any:
    good = _good_repository(repo, vision, mlm)
    for make in breakers:
        with contextlib.suppress(FileExistsError):  # the same breaker drawn twice
            make(repo, vision)
    sources = scan(repo)  # must not raise
    for name, versions in good.items():
        assert sources[name].complete_versions() == versions and sources[name].problem is None
    _sendable(sources)
    return sources


def _reasons(sources: dict[str, ModelSource]) -> str:
    return "\n".join(
        [p for s in sources.values() for p in s.problems()]
        + [v.problem for s in sources.values() for v in s.versions.values() if v.problem]
    )


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_directory_is_listed_with_its_reason(
    tmp_path: Path, tiny_vision_served: Path, tiny_mlm_served: Path, case: str
) -> None:
    make, reason = BROKEN[case]
    repo = tmp_path / "models"
    repo.mkdir()
    sources = _scan_with(repo, tiny_vision_served, tiny_mlm_served, [make])
    assert reason in _reasons(sources)
    broken = {n: s for n, s in sources.items() if not n.startswith("good-")}
    assert all(s.problem or not s.complete_versions() for s in broken.values()), "broken, would load"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FILE_NAMES = st.text(min_size=1, max_size=30).filter(
    lambda n: (
        "/" not in n
        and "\0" not in n
        and n not in (".", "..")
        and len(n.encode("utf-8", "surrogateescape")) < 200
    )
)
CONFIG_KEYS = st.sampled_from(["name", "task", "variants", "labels", "tokenizer", "check", "model", "format"])
BREAKERS = st.one_of(
    st.sampled_from([make for make, _ in BROKEN.values()]),
    st.binary(max_size=64).map(raw_config),
    st.builds(config_field, CONFIG_KEYS, JSON),
    st.builds(config_field, CONFIG_KEYS, FILE_NAMES),
    FILE_NAMES.filter(lambda n: not n.startswith(".")).map(version_named),
    st.binary(min_size=1, max_size=60).map(lambda b: b'{"version_policy": ' + b + b"}").map(policy_file),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(breakers=st.lists(BREAKERS, min_size=1, max_size=4))
def test_generated_broken_directories_never_break_the_scan(
    tiny_vision_served: Path, tiny_mlm_served: Path, breakers: list[Maker]
) -> None:
    with tempfile.TemporaryDirectory(prefix="gmlp-hostile-") as root:
        (Path(root) / "models").mkdir()
        _scan_with(Path(root) / "models", tiny_vision_served, tiny_mlm_served, breakers)


def _strict_oracle(text: str) -> bool:
    """What a version is, said independently of the parser: ASCII 0-9 only, no leading zero."""
    return 0 < len(text) <= MAX_VERSION_DIGITS and all(c in "0123456789" for c in text) and text[0] != "0"


VERSION_TEXTS = st.one_of(
    st.text(max_size=25),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl", "Zs", "Cc"]), max_size=6),
    st.from_regex(r"[+\- 0]?[0-9]{1,30}[ \n]?", fullmatch=True),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
)


@given(VERSION_TEXTS)
def test_one_strict_spelling_of_a_version(text: str) -> None:
    if _strict_oracle(text):
        assert str(parse_version(text)) == text
    else:
        with pytest.raises(VersionError, match="ASCII digits"):
            parse_version(text)
