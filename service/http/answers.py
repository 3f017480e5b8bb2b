"""The task routes' and the Hugging Face API's JSON answers, encoded off the event loop when big.

Their size follows from what was asked (top_k labels per image; top_k predictions, or one per
target, per [MASK]), all bounded by the request limits (top_k <= 100, at most 1000 targets, the
model's max_predictions [MASK]s). Most answers are a few hundred bytes and are encoded in place;
one of many ranked entries is encoded in a worker thread (`service.engine.offload`), so that no
answer pauses the loop that serves every other request and probe.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from service.engine.offload import encode_off_loop

# A generous bound of one ranked entry's JSON: label or token text, score, id, sequence prefix.
ENTRY_BYTES = 256


def ranked_entries(predictions: Any) -> int:
    """How many ranked entries an answer holds: a list of them, or a list of lists (per [MASK])."""
    if not isinstance(predictions, list):
        return 1
    return sum(len(item) if isinstance(item, list) else 1 for item in predictions)


async def json_answer(body: Any, predictions: Any) -> JSONResponse:
    """`body` as a JSON response; encoded in a worker thread when `predictions` make it big."""
    return await encode_off_loop(lambda: JSONResponse(body), ENTRY_BYTES * ranked_entries(predictions))


__all__ = ["ENTRY_BYTES", "json_answer", "ranked_entries"]
