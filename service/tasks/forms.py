"""What the Open Inference Protocol forms of every task share (`service.tasks.pipeline.Forms`
and the tasks' own): tensor metadata, stacking rows into output tensors, the `top_k` parameter
and the `predictions` output. Metadata keeps the served config's shapes: a named (dynamic) axis
is -1, so a masked LM takes any length up to n and any number of positions up to
max_predictions. Every refusal names the tensor and is an `InvalidInput`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np

from contract.errors import ErrorCode, InvalidInput
from contract.formats import MAX_FILL_MASK_TOP_K
from contract.tensors import Tensor, bytes_tensor, datatype_of

T = TypeVar("T")
IMAGE_INPUT, TEXT_INPUT, PREDICTIONS_OUTPUT = "image", "text", "predictions"


def tensor_meta(name: str, datatype: str, shape: Sequence[Any]) -> dict[str, Any]:
    """Tensor metadata; a named (dynamic) dimension is -1."""
    return {"name": name, "datatype": datatype, "shape": [d if isinstance(d, int) else -1 for d in shape]}


def graph_tensors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The graph's tensors as the served config declares them."""
    return [
        tensor_meta(e["name"], datatype_of(np.dtype(str(e.get("dtype", "float32")))), e["shape"])
        for e in entries
    ]


async def gather_or_cancel(work: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; if one fails (a row refused, the queue full), the others are withdrawn at once."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def top_k_parameter(parameters: dict[str, Any]) -> int:
    top_k = parameters.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_FILL_MASK_TOP_K:
        raise InvalidInput(
            ErrorCode.INVALID_TOP_K, f"parameter top_k must be an integer in 1..{MAX_FILL_MASK_TOP_K}"
        )
    return top_k


def stacked(name: str, rows: Sequence[np.ndarray]) -> Tensor:
    """A graph output of a request's rows (images, or texts with their [MASK] rows), as one tensor."""
    if len({row.shape for row in rows}) != 1:
        raise InvalidInput(
            ErrorCode.INVALID_OUTPUTS,
            f"output {name} needs the same number of [MASK] tokens in every text of a request; "
            "ask for predictions only, or send the texts in separate requests",
        )
    array = np.stack(rows)
    return Tensor(name, datatype_of(array.dtype), array)


def predictions(answers: Sequence[Any], shape: Sequence[int]) -> Tensor:
    """The JSON of `/fill-mask` for each row (decoded in the batch thread), as a BYTES tensor of
    `shape` (one element per row)."""
    items = [json.dumps(answer, ensure_ascii=False).encode("utf-8") for answer in answers]
    return bytes_tensor(PREDICTIONS_OUTPUT, items, shape)


def utf8(item: bytes) -> str:
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(ErrorCode.INVALID_TEXT, "input text must be UTF-8 encoded") from None
