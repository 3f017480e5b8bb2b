"""Rewrite the settings tables of docs/service.md ("## Settings") from `ServiceSettings`.

    python -m scripts.settings_docs     # `make settings-docs`, from the checkout

The fields' groups and docstrings in service/settings.py are the only text about a setting;
tests/service/test_config.py fails when the committed tables differ from what this writes.
"""

from __future__ import annotations

from pathlib import Path

from service.cli import SETTINGS_BEGIN, SETTINGS_END, settings_tables

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "service.md"


def main() -> None:
    text = DOCS.read_text()
    head, rest = text.split(SETTINGS_BEGIN, 1)
    _, tail = rest.split(SETTINGS_END, 1)
    DOCS.write_text(f"{head}{SETTINGS_BEGIN}\n\n{settings_tables()}\n{SETTINGS_END}{tail}")
    print(f"wrote the settings tables of {DOCS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
