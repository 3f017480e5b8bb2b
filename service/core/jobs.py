"""A batch's rows as the pipelines submit them, and what the batch thread hands back for each.

A task request's post-processing (scores, ranking, label and token-string lookups) runs in the
batch thread, once per batch and vectorised over its rows, not once per request on the event
loop: a `Job` carries the request's graph inputs and what it asks of them, a `Done` the row's
outputs and its finished answer. A raw inference request (the v2 tensor API) asks for nothing
but its outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.scores import ScoreFunction, ranked_labels
from contract.text import EncodedText, FillMaskCodec
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


def rank_rows(jobs: Sequence[Job], outputs: Sequence[Feeds], labels: Sequence[str]) -> list[Any]:
    """A classifier batch's answers: the ranked labels of the rows that ask for them (None for the
    others), one vectorised pass per score function at the largest top_k among its rows, each row
    keeping its own prefix of that ranking."""
    answers: list[Any] = [None] * len(jobs)
    groups: dict[ScoreFunction, list[tuple[int, int]]] = {}
    for i, job in enumerate(jobs):
        if isinstance(job.answer, Ranking):
            groups.setdefault(job.answer.function, []).append((i, job.answer.top_k))
    for function, asks in groups.items():
        logits = np.stack([outputs[i]["logits"] for i, _ in asks])
        ranked = ranked_labels(logits, labels, max(k for _, k in asks), function)
        for (i, k), answer in zip(asks, ranked, strict=True):
            answers[i] = answer[:k]
    return answers


def decode_rows(jobs: Sequence[Job], outputs: Sequence[Feeds], codec: FillMaskCodec) -> list[Any]:
    """A masked LM batch's answers: the decoded predictions of the rows that ask for them (None for
    the others), the normalisers of all their mask rows in one pass (`FillMaskCodec.decode_batch`)."""
    answers: list[Any] = [None] * len(jobs)
    asks = [(i, job.answer) for i, job in enumerate(jobs) if isinstance(job.answer, Decoding)]
    if asks:
        decoded = codec.decode_batch(
            [a.encoded for _, a in asks],
            [outputs[i]["logits"] for i, _ in asks],
            [a.top_k for _, a in asks],
            [a.target_ids for _, a in asks],
        )
        for (i, _), answer in zip(asks, decoded, strict=True):
            answers[i] = answer
    return answers


__all__ = ["Job", "Done", "Ranking", "Decoding", "rank_rows", "decode_rows"]
