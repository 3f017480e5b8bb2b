"""Logits -> probabilities and rankings, the same for every task and every caller."""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (scores are reported to clients as probabilities)."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    return probs / probs.sum(axis=-1, keepdims=True)


def ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores, best first; ties keep index order (deterministic output)."""
    return np.argsort(-scores, kind="stable")[:k]


__all__ = ["softmax", "ranked"]
