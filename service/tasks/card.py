"""A model card's summary: the first lines and the accuracy figures of a served model's README.md.

`gmlp export` copies a checkpoint's model card (README.md, written by `gmlp model-card`) into the
served directory. Its figures are JSON blocks: the training run's `## Results`, and under
`## Served model (exported ONNX)` one block per evaluated variant, after the `gmlp eval ...
--variant V` command that measured it. The summary takes the served variant's block when the card
has one (else the training results) and keeps the accuracy leaves (`top1`, `top5`, `accuracy`...),
named by their path, so that the playground can show them without reading Markdown.
"""

from __future__ import annotations

import json
import re
from contextlib import suppress
from pathlib import Path
from typing import Any

from contract.spec import SpecError, confined

CARD_FILE = "README.md"
_JSON_BLOCK = re.compile(r"```json\n(.*?)\n```", re.DOTALL)
_ACCURACY_KEY = re.compile(r"^(top\d+|acc|accuracy)$")


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section, up to the next `## ` ("" without one)."""
    start = text.find(f"\n## {heading}")
    if start < 0:
        return ""
    body = text[start + 1 :].split("\n", 1)[-1]
    end = body.find("\n## ")
    return body if end < 0 else body[:end]


def _first_json(text: str) -> Any:
    found = _JSON_BLOCK.search(text)
    with suppress(ValueError):
        return json.loads(found.group(1)) if found is not None else None
    return None


def accuracy_leaves(results: Any, prefix: str = "") -> dict[str, float]:
    """The accuracy figures of a results document, by their path (`cifar10_test top1`)."""
    leaves: dict[str, float] = {}
    if isinstance(results, dict):
        for key, value in results.items():
            path = f"{prefix} {key}".strip()
            if isinstance(value, dict):
                leaves.update(accuracy_leaves(value, path))
            elif isinstance(value, int | float) and _ACCURACY_KEY.match(str(key)):
                leaves[path] = float(value)
    return leaves


def card_summary(directory: Path, variant: str) -> dict[str, Any] | None:
    """The summary of the card in `directory` for the served `variant`; None without a card.

    `title` and `description` are the heading and first paragraph; `accuracy` the figures and
    `measured` what they are of ("int8" for the served variant's own, "training" otherwise)."""
    try:
        path = confined(directory, CARD_FILE, "card")  # a link out of the directory shows nothing
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, SpecError):
        return None
    lines = text.strip().splitlines()
    title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("# ") else None
    paragraphs = [p.strip() for p in "\n".join(lines[1:]).split("\n\n") if p.strip()]
    description = next((p for p in paragraphs if not p.startswith(("#", "-", "`"))), None)
    accuracy, measured = {}, None
    served = _section(text, "Served model")
    marker = f"--variant {variant}`"
    if marker in served:
        accuracy, measured = accuracy_leaves(_first_json(served.split(marker, 1)[1])), variant
    if not accuracy:
        accuracy = accuracy_leaves(_first_json(_section(text, "Results")))
        measured = "training" if accuracy else None
    return {"title": title, "description": description, "accuracy": accuracy, "measured": measured}
