"""A batch's rows as the pipelines submit them, and what the batch thread hands back for each.

A task request's post-processing (scores, ranking, label and token-string lookups) runs in the
batch thread, once per batch and vectorised over its rows, not once per request on the event
loop: a `Job` carries the request's graph inputs and what it asks of them, a `Done` the row's
outputs and its finished answer. A raw inference request (the v2 tensor API) asks for nothing
but its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.scores import ScoreFunction
from contract.text import EncodedText
from service.core.runtime import Feeds


@dataclass(frozen=True)
class Ranking:
    """A classification request's answer: its `top_k` labels scored by `function`."""

    top_k: int
    function: ScoreFunction = "softmax"


@dataclass(frozen=True, eq=False)
class Decoding:
    """A fill-mask request's answer: the `top_k` tokens of each [MASK] (among `target_ids`)."""

    encoded: EncodedText
    top_k: int
    target_ids: list[int] | None = None


@dataclass(frozen=True, eq=False)
class Job:
    """One request's row of a batch: its graph inputs, the answer it asks for (None: the outputs
    alone) and whether its prediction counts in the quality metrics (task requests do)."""

    feeds: Feeds
    answer: Ranking | Decoding | None = None
    observed: bool = False


@dataclass(frozen=True, eq=False)
class Done:
    """One row's result: the graph outputs, the answer when the job asked for one, and when the
    batch thread worked out its batch's answers (monotonic start and end: the request's
    `postprocess` span)."""

    outputs: Feeds
    answer: Any = None
    finished: tuple[float, float] = (0.0, 0.0)


__all__ = ["Job", "Done", "Ranking", "Decoding"]
