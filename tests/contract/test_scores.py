"""Top-k probabilities by partial selection against a full float64 softmax and a stable sort, and
the selection of the k largest against a full sort."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.scores import (
    SCORE_FUNCTIONS,
    k_largest,
    log_normalisers,
    ranked,
    ranked_labels,
    softmax,
    top_probabilities,
)


def _reference(logits: np.ndarray, k: int, candidates: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    row = logits.astype(np.float64)
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    pool = np.arange(row.shape[0]) if candidates is None else candidates
    order = np.argsort(-probs[pool], kind="stable")[:k]
    return pool[order], probs[pool][order]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 5, 100, 40_000])
def test_matches_a_full_softmax_and_a_stable_sort(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    # Integers make many exact ties, which must be broken by position, as a stable sort does.
    logits = rng.integers(-8, 8, 30_522).astype(np.float32) if seed % 2 else rng.normal(0, 4, 30_522)
    logits = logits.astype(np.float32)
    candidates = None if seed < 3 else rng.choice(30_522, 50, replace=False)
    ids, probs = top_probabilities(logits, k, candidates)
    want_ids, want_probs = _reference(logits, k, candidates)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(probs, want_probs, rtol=1e-6, atol=0)
    assert len(ids) == min(k, 30_522 if candidates is None else 50)


def test_scores_stay_full_row_probabilities_with_candidates() -> None:
    logits = np.zeros(10, np.float32)
    logits[3] = 5.0
    ids, probs = top_probabilities(logits, 2, np.array([7, 1]))
    assert ids.tolist() == [7, 1]  # a tie: the earlier candidate first
    np.testing.assert_allclose(probs, [1 / (9 + np.exp(5.0))] * 2, rtol=1e-6)


@settings(max_examples=300, deadline=None)
@given(
    row=hnp.arrays(
        np.float32,
        st.integers(1, 400),
        # Few distinct values: ties within and across blocks, and at the k-th largest.
        elements=st.sampled_from([-np.inf, -3.0, 0.0, 0.5, 2.0, 7.0]) | st.floats(-10, 10, width=32),
    ),
    k=st.integers(1, 12),
    block=st.integers(1, 40),
    layout=st.sampled_from(["as drawn", "sorted", "reversed"]),
)
def test_k_largest_leaves_out_nothing_larger(row: np.ndarray, k: int, block: int, layout: str) -> None:
    """Against a full sort: the chosen entries are k distinct indices whose smallest value is the
    row's k-th largest, so nothing left out exceeds them, wherever the large values lie (one
    block, the tail that fills no block, spread out). Small blocks put short rows on the path a
    vocabulary row takes."""
    if layout != "as drawn":
        row = np.sort(row) if layout == "sorted" else np.sort(row)[::-1].copy()
    k = min(k, row.shape[0] - 1) if row.shape[0] > 1 else 0
    if k == 0:
        return
    chosen = k_largest(row, k, block)
    assert len(set(chosen.tolist())) == k
    kth = np.sort(row)[::-1][k - 1]
    assert row[chosen].min() == kth
    left_out = np.setdiff1d(np.arange(row.shape[0]), chosen)
    assert (row[left_out] <= kth).all()


def _rows(seed: int, m: int, n: int, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.normal(scale=4.0, size=(m, n)).astype(np.float32)
    # Rounded to a few values, most rows hold ties, also at the top and across the k-th place.
    return np.round(rows / 2.0).astype(np.float32) if ties else rows


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_batch_ranking_equals_the_per_request_ranking(seed: int, ties: bool) -> None:
    """`ranked_labels` over a batch's rows gives every row exactly what one request's scores and
    `ranked` give it (labels, order, and the very same floats), for every score function."""
    m, n = 1 + seed * 3, (2, 10, 37)[seed % 3]
    rows = _rows(seed, m, n, ties)
    labels = [f"label-{i}" for i in range(n)]
    for function, score in SCORE_FUNCTIONS.items():
        for k in {1, min(5, n), n}:
            batch = ranked_labels(rows, labels, k, function)
            for row, answer in zip(rows, batch, strict=True):
                scores = score(row)
                assert answer == [{"label": labels[i], "score": float(scores[i])} for i in ranked(scores, k)]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("n", [10, 30522])
def test_batch_normalisers_equal_the_per_row_ones(n: int, ties: bool) -> None:
    """The normalisers of a batch's rows in one pass are bit for bit each row's own, so the
    probabilities a batch decodes are those one request would get."""
    rows = _rows(n, 12, n, ties)
    together = log_normalisers(rows)
    assert [float(z) for z in together] == [float(log_normalisers(row)) for row in rows]
    np.testing.assert_array_equal(softmax(rows), np.stack([softmax(row) for row in rows]))
    for row, z in zip(rows, together, strict=True):
        for got, want in zip(
            top_probabilities(row, 5, log_z=float(z)), top_probabilities(row, 5), strict=True
        ):
            np.testing.assert_array_equal(got, want)


def test_batch_ranking_keeps_ties_in_index_order() -> None:
    rows = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    assert ranked(rows, 3).tolist() == [[1, 2, 0], [0, 1, 2]]
