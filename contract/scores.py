"""Logits -> probabilities and rankings, the same for every task and every caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (scores are reported to clients as probabilities)."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    return probs / probs.sum(axis=-1, keepdims=True)


def ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores, best first; ties keep index order (deterministic output)."""
    return np.argsort(-scores, kind="stable")[:k]


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise logistic in float64 (multi-label style scores, when a client asks for them)."""
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


ScoreFunction = Literal["softmax", "sigmoid", "none"]
# How logits become the scores a client sees; "none" reports the logits themselves.
SCORE_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": lambda logits: logits.astype(np.float64),
}


__all__ = ["softmax", "sigmoid", "ranked", "ScoreFunction", "SCORE_FUNCTIONS"]
