"""A model card's summary: the first lines and the accuracy figures of a served model's README.md.

`gmlp export` copies a checkpoint's model card (README.md, written by `gmlp model-card`) into the
served directory. Its figures are JSON blocks: the training run's `## Results`, and under
`## Served model (exported ONNX)` one block per evaluated variant, after the `gmlp eval ...
--variant V` command that measured it. The summary takes the served variant's block when the card
has one (else the training results) and keeps the accuracy leaves (`top1`, `top5`, `accuracy`...),
named by their path, so that the playground can show them without reading Markdown.

The card is read as every file of a model is (`contract.spec.read_regular`): a regular file of at
most `MAX_CARD_BYTES`, else the version is refused with the reason (a FIFO would block the load
for good, a huge card cost its size in memory). A card that is missing, not UTF-8 or linked out of
the directory is simply not shown.
"""

from __future__ import annotations

import json
import re
from contextlib import suppress
from pathlib import Path
from typing import Any

from contract.formats import CARD_FILE
from contract.limits import MAX_CARD_BYTES
from contract.spec import SpecError, confined, read_regular

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
    SpecError when the card is not a regular file or is over `MAX_CARD_BYTES`.

    `title` and `description` are the heading and first paragraph; `accuracy` the figures and
    `measured` what they are of ("int8" for the served variant's own, "training" otherwise)."""
    try:
        path = confined(directory, CARD_FILE, "card")  # a link out of the directory shows nothing
    except SpecError:
        return None
    if not path.exists():  # follows links (a dangling one is no card); never opens the file
        return None
    try:
        text = read_regular(path, "card", MAX_CARD_BYTES).decode("utf-8")
    except UnicodeDecodeError:
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
