"""The version is written once (pyproject.toml); what the service reports and the changelog follow it."""

from __future__ import annotations

import re
import tomllib

from contract.formats import package_version
from support.helpers import REPO_ROOT


def _declared() -> str:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_the_reported_version_is_the_declared_one() -> None:
    # package_version() reads the installed metadata, which pip derives from pyproject.toml.
    assert package_version() == _declared()


def test_the_newest_changelog_entry_is_the_declared_version() -> None:
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (REPO_ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert releases, "CHANGELOG.md has no '## [x.y.z]' release heading"
    assert releases[0] == _declared(), "bump CHANGELOG.md and pyproject.toml's version together"
    assert len(releases) == len(set(releases)), f"a release is listed twice: {releases}"
