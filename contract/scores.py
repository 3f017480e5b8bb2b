"""Logits -> the best-scoring classes or tokens with their probabilities, for every task and caller.

A masked LM's row has a whole vocabulary (30,522 entries for BERT's), of which a response needs
`top_k`: the softmax normaliser is one float32 pass over the row (accumulated in float64), the
candidates are found by partial selection (among the blocks with the highest maxima), and only
they are sorted and exponentiated. Scores are always probabilities over the whole row, also when
`candidates` restricts what may be returned (Hugging Face's fill-mask `targets`).

A broken model can put NaN or infinities among its logits; a row holding NaN or +inf has no
probabilities (each is NaN), yet still ranks (NaN last) and answers `k` entries. JSON has no NaN
or Infinity, so an answer's score that is not finite is written `null` (`json_score`), as v2
writes a non-finite tensor element: a 200 with valid JSON, never a 500 from the encoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np


def log_normalisers(rows: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of every row (the last axis) of `rows`, computed stably, in float64: the
    same arithmetic for one row as for a batch's, so that a batch's scores equal its rows' scores
    taken one by one."""
    peak = rows.max(axis=-1, keepdims=True)
    return peak[..., 0].astype(np.float64) + np.log(np.exp(rows - peak).sum(axis=-1, dtype=np.float64))


def json_score(value: float) -> float | None:
    """A score as an answer carries it: the number, or None (JSON null) when it is NaN or infinite."""
    return value if math.isfinite(value) else None


# Width of the blocks whose maxima narrow a long row down before the exact selection.
_BLOCK = 256


def k_largest(scores: np.ndarray, k: int, block: int = _BLOCK) -> np.ndarray:
    """Indices of `k` entries that no entry left out exceeds (in no order; 0 < k < len(scores)).

    A long row is narrowed first: the k blocks with the highest maxima, plus the tail that fills
    no block, hold k entries at least as large as any other. (Were an entry above the k-th largest
    value in a block left out, each of the k blocks taken would hold a larger maximum, and the
    row would have k + 1 entries above its k-th largest.) Selecting among those ~k * 256 entries
    is cheaper than a selection over a whole 30,522-token vocabulary row.
    """
    n = scores.shape[0]
    blocks = n // block
    if 4 * k * block > n:
        return np.argpartition(scores, n - k)[n - k :]
    peaks = scores[: blocks * block].reshape(blocks, block).max(axis=1)
    taken = np.argpartition(peaks, blocks - k)[blocks - k :]
    pool = np.concatenate([(taken[:, None] * block + np.arange(block)).ravel(), np.arange(blocks * block, n)])
    m = pool.shape[0]
    return pool[np.argpartition(scores[pool], m - k)[m - k :]]


def top_probabilities(
    logits: np.ndarray, k: int, candidates: np.ndarray | None = None, log_z: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, probabilities) of the `k` most probable entries of `logits` [n], best first.

    `candidates` (indices) restricts the choice. Ties are broken by position (the lower index, or
    the earlier candidate, first), so the answer is deterministic. `log_z`, the row's
    `log_normalisers` when it was computed already (over a whole batch's rows at once)."""
    row = np.asarray(logits, dtype=np.float32)
    if log_z is None:
        log_z = float(log_normalisers(row))
    scores = row if candidates is None else row[candidates]
    if math.isnan(log_z):  # a NaN or +inf logit: NaN ranks last (NaN == NaN is false below)
        scores = np.where(np.isnan(scores), -np.inf, scores)
    k = min(k, scores.shape[0])
    n = scores.shape[0]
    if k < n:
        # The k largest in any order; whatever is above their minimum is among them, and ties at
        # the minimum are then taken from the whole row in index order.
        largest = k_largest(scores, k)
        threshold = scores[largest].min()
        above = largest[scores[largest] > threshold]
        picked = np.concatenate([above, np.flatnonzero(scores == threshold)[: k - above.shape[0]]])
    else:
        picked = np.arange(scores.shape[0])
    picked = picked[np.lexsort((picked, -scores[picked]))]
    probabilities = np.exp(scores[picked].astype(np.float64) - log_z)
    return (picked if candidates is None else np.asarray(candidates)[picked]), probabilities


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of every row (the last axis) of `logits`, in float64."""
    rows = np.asarray(logits, dtype=np.float64)
    return np.exp(rows - log_normalisers(rows)[..., None])


def ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores of every row (the last axis), best first; ties keep index
    order (deterministic output). A full sort: for short rows (class labels); a vocabulary row
    takes `top_probabilities`."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def top_k_mismatch(
    ids: np.ndarray, scores: np.ndarray, probabilities: np.ndarray, tolerance: float
) -> str | None:
    """None when top-k outputs (`ids`, `scores` [..., K], best first) fit reference
    `probabilities` [..., n] of the same rows, else what does not.

    Fitting: the ids of a row are distinct and in range, each score is the reference probability
    of its id within `tolerance`, and the j-th id is as probable as the reference's j-th most
    probable entry within `tolerance`; so ids equal the reference's wherever its probabilities
    are not tied within the tolerance, and tied ones may come in either order."""
    k, n = ids.shape[-1], probabilities.shape[-1]
    rows, ranks = ids.reshape(-1, k), scores.reshape(-1, k).astype(np.float64)
    reference = probabilities.reshape(-1, n).astype(np.float64)
    if rows.shape[0] != reference.shape[0] or ranks.shape != rows.shape:
        return f"top-k shapes {ids.shape} / {scores.shape} do not fit the rows {probabilities.shape}"
    if rows.min() < 0 or rows.max() >= n:
        return f"top-k ids outside [0, {n})"
    if k > 1 and (np.diff(np.sort(rows, axis=1), axis=1) == 0).any():
        return "a row's top-k ids repeat"
    picked = np.take_along_axis(reference, rows, axis=1)
    best = -np.sort(-reference, axis=1)[:, :k]
    score_diff, rank_diff = float(np.abs(ranks - picked).max()), float(np.abs(picked - best).max())
    if score_diff > tolerance:
        return f"top-k scores differ from the probabilities of their ids by {score_diff:.3g}"
    if rank_diff > tolerance:
        return f"top-k ids are not the most probable: off by {rank_diff:.3g} in probability"
    return None


ScoreFunction = Literal["softmax", "sigmoid", "none"]
# How logits become the scores a client sees, for one row or a batch's rows: "softmax" row by row,
# "sigmoid" the element-wise logistic (multi-label style scores, when a client asks for them),
# "none" the logits themselves.
SCORE_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": lambda logits: 1.0 / (1.0 + np.exp(-logits.astype(np.float64))),
    "none": lambda logits: logits.astype(np.float64),
}


def labelled_rows(ids: np.ndarray, scores: np.ndarray, labels: Sequence[str]) -> list[list[dict[str, Any]]]:
    """Rows of class ids and their scores [m, k], best first, as the answers' `{"label", "score"}`
    lists: what ranking the logits and reading a graph's top-k outputs both end in (a score that is
    not finite: None, `json_score`)."""
    return [
        [{"label": labels[i], "score": json_score(v)} for i, v in zip(row, vals, strict=True)]
        for row, vals in zip(np.asarray(ids).tolist(), np.asarray(scores).tolist(), strict=True)
    ]


def ranked_labels(
    logits: np.ndarray, labels: Sequence[str], k: int, function: str = "softmax"
) -> list[list[dict[str, Any]]]:
    """The `k` best labels of every row of `logits` [m, classes] with their scores, best first:
    one vectorised pass over a batch's rows instead of one call per row, with the same answer
    per row as `SCORE_FUNCTIONS[function]` and `ranked` give it."""
    scores = SCORE_FUNCTIONS[function](np.asarray(logits))
    top = ranked(scores, k)
    return labelled_rows(top, np.take_along_axis(scores, top, axis=1), labels)
