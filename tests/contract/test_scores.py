"""Top-k probabilities by partial selection against a full float64 softmax and a stable sort."""

from __future__ import annotations

import numpy as np
import pytest

from contract.scores import top_probabilities


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
