"""A batch's rows as the pipelines submit them, and what the batch thread hands back for each.

A task request's post-processing (scores, ranking, label and token-string lookups) runs in the
batch thread, once per batch and vectorised over its rows, not once per request on the event
loop: a `Job` carries the request's graph inputs and what it asks of them, a `Done` the row's
outputs and its finished answer. A raw inference request (the v2 tensor API) asks for nothing
but its outputs.

A graph exported with top-k outputs (`topk_ids`, `topk_scores`, K per row) answers a row from
them when the row asks for no more than K candidates over the whole row with softmax scores
(`from_top_k`); the others are answered from their full `logits` rows. Both give the same tokens
and labels, in the same order (ties: the lower id first), and the same scores within float
rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from contract.formats import GRAPH_TOP_K_KEY, TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from service.engine.request_context import Timings
from service.engine.runtime import Feeds


class Answer(Protocol):
    """What the engine needs of the answer a row asks for; the answers themselves are their
    tasks' (a classifier's ranking, a masked LM's decoding, in `service.tasks`), worked out by the
    task's `finish` in the batch thread. The engine reads how many candidates the answer wants and
    whether they are chosen over the whole row with softmax scores: what the graph's top-k
    outputs hold (`from_top_k`)."""

    @property
    def top_k(self) -> int: ...

    @property
    def whole_row_softmax(self) -> bool: ...


@dataclass(frozen=True, eq=False)
class Job:
    """One request's row of a batch: its graph inputs, the answer it asks for (None: the outputs
    alone), whether its prediction counts in the quality metrics (task requests do) and the graph
    outputs its caller reads from `Done.outputs` (None: all of them; a task request reads none)."""

    feeds: Feeds
    answer: Answer | None = None
    observed: bool = False
    reads: frozenset[str] | None = None


Reads = frozenset[str]  # names of graph outputs
TOP_K_OUTPUTS: Reads = frozenset({TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT})
NOTHING: Reads = frozenset()


def graph_top_k(config: Mapping[str, Any], output_names: Sequence[str]) -> int:
    """K of a served graph's top-k outputs: config.json's `graph_top_k` where the graph has both
    outputs; 0 for a directory exported without them."""
    k = config.get(GRAPH_TOP_K_KEY)
    return k if isinstance(k, int) and set(output_names) >= TOP_K_OUTPUTS else 0


def from_top_k(answer: Answer | None, k: int) -> bool:
    """Whether the graph's top-k outputs (K = `k`, 0: none) hold `answer`: at most K candidates,
    chosen over the whole row, scored by softmax."""
    if k < 2 or answer is None or answer.top_k > k:  # K = 1 gives no margin for the metrics
        return False
    return answer.whole_row_softmax


def outputs_to_run(jobs: Sequence[Job], top: Sequence[bool], available: Sequence[str]) -> list[str]:
    """The graph outputs a batch's session run asks for, in the graph's order: what each caller
    reads, and for each answer (or observed row) the top-k pair where `top` says it is answered
    from it, else `logits`. A batch answered from the top-k outputs alone never copies logits out."""
    wanted: set[str] = set()
    for job, from_top in zip(jobs, top, strict=True):
        wanted |= set(available) if job.reads is None else job.reads
        if job.answer is not None or job.observed:
            wanted |= TOP_K_OUTPUTS if from_top else {"logits"}
    return [name for name in available if name in wanted]


@dataclass(frozen=True, eq=False)
class Done:
    """One row's result: the graph outputs, the answer when the job asked for one, when the batch
    thread worked out its batch's answers (monotonic start and end: the request's `postprocess`
    span), and the row's queue wait and batch run (set once the batcher returns it)."""

    outputs: Feeds
    answer: Any = None
    finished: tuple[float, float] = (0.0, 0.0)
    timings: Timings = Timings()


def observed_rows(
    jobs: Sequence[Job], outputs: Sequence[Feeds], top: Sequence[bool], rows: Callable[[Job], int]
) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """The predictions of a batch's observed rows for the quality metrics: `logits` rows of those
    answered from them, (ids, scores) of those answered from the top-k outputs; `rows(job)` is
    how many leading rows of a job's outputs are its predictions."""
    logits, ranked = [], []
    for job, out, from_top in zip(jobs, outputs, top, strict=True):
        if job.observed:
            names = (TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT) if from_top else ("logits",)
            # A classifier's row is 1-D: its one prediction.
            lead = [out[k][None] if out[k].ndim == 1 else out[k][: rows(job)] for k in names]
            if from_top:
                ranked.append((lead[0], lead[1]))
            else:
                logits.append(lead[0])
    return logits, ranked
