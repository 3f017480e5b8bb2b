"""Fallback dependency check where pip-audit's vulnerability data is unreachable (docs/reliability.md).

PyPI's project page (`/pypi/NAME/json`) lists the known vulnerabilities of the project's *latest*
release only. For each `name==version` of a requirements file this prints whether the pin is that
latest release and, if so, the vulnerabilities PyPI lists for it. Pins older than the latest are
listed as unchecked: this says nothing about them, which is why `make audit` is the real audit.

    python scripts/audit_latest.py .venv-audit/serve-requirements.txt
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path


def latest(name: str) -> tuple[str, list[dict[str, object]]]:
    """(latest version, known vulnerabilities of that version) from PyPI's project page."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=30) as response:
        page = json.load(response)
    return page["info"]["version"], list(page.get("vulnerabilities") or [])


def main(argv: list[str]) -> int:
    pins = [line.strip().split("==", 1) for line in Path(argv[1]).read_text().splitlines() if "==" in line]
    found, unchecked = [], []
    for name, version in pins:
        newest, vulnerabilities = latest(name)
        if newest != version:
            unchecked.append(f"{name} {version} (latest {newest})")
            continue
        found += [f"{name} {version}: {v.get('id')} (fixed in {v.get('fixed_in')})" for v in vulnerabilities]
    print(f"{len(pins)} pins, {len(pins) - len(unchecked)} at their latest release")
    print("known vulnerabilities of those:", "; ".join(found) or "none")
    print("not checked (older than the latest release):", "; ".join(unchecked) or "none")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
