"""Validation of /classify and /fill-mask answers: under load, a wrong answer counts as a failure.

A server that answers 200 quickly with garbage (a batch row given to the wrong request, a
truncated list, NaN scores) must not look fast and healthy in the report. Each function returns
None for a good answer or a short message saying what is wrong; the locustfile turns the message
into `response.failure(...)`. Pure functions over decoded JSON, so they are unit-tested without
a server.
"""

from __future__ import annotations

import math
from typing import Any

from contract.formats import MASK_TOKEN

# Softmax scores of different requests are summed in float64 by the server; allow rounding only.
_SCORE_SLACK = 1e-6


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_scores(scores: list[float], where: str) -> str | None:
    """Scores are probabilities, highest first, and sum to at most one."""
    for i, score in enumerate(scores):
        if not -_SCORE_SLACK <= score <= 1.0 + _SCORE_SLACK:
            return f"{where}: score {i} = {score} is not a probability"
    if any(a < b for a, b in zip(scores, scores[1:], strict=False)):
        return f"{where}: scores are not sorted highest first: {scores}"
    if sum(scores) > 1.0 + _SCORE_SLACK * len(scores):
        return f"{where}: scores sum to {sum(scores)} > 1"
    return None


def _check_model(body: Any, expected_model: str | None) -> str | None:
    if not isinstance(body, dict):
        return f"body is {type(body).__name__}, expected a JSON object"
    missing = {"model", "predictions"} - body.keys()
    if missing:
        return f"keys {sorted(missing)} missing (got {sorted(body)})"
    if not isinstance(body["model"], str) or not body["model"]:
        return f"model is {body['model']!r}, expected a model name"
    if expected_model is not None and body["model"] != expected_model:
        return f"answered by model {body['model']!r}, asked for {expected_model!r}"
    if not isinstance(body["predictions"], list):
        return f"predictions is {type(body['predictions']).__name__}, expected a list"
    return None


def check_classify(body: Any, top_k: int, expected_model: str | None = None) -> str | None:
    """`{"model", "predictions": [{"label": str, "score": float}] * top_k}`, sorted by score."""
    error = _check_model(body, expected_model)
    if error:
        return error
    predictions = body["predictions"]
    if len(predictions) != top_k:
        return f"{len(predictions)} predictions, asked for top_k={top_k}"
    scores = []
    for i, item in enumerate(predictions):
        if not isinstance(item, dict) or set(item) != {"label", "score"}:
            return f"prediction {i} is {item!r}, expected {{'label', 'score'}}"
        if not isinstance(item["label"], str) or not item["label"]:
            return f"prediction {i}: label {item['label']!r} is not a non-empty string"
        if not _is_number(item["score"]):
            return f"prediction {i}: score {item['score']!r} is not a finite number"
        scores.append(float(item["score"]))
    labels = [item["label"] for item in predictions]
    if len(set(labels)) != len(labels):
        return f"duplicate labels: {labels}"
    return _check_scores(scores, "predictions")


_MASK_KEYS = {"score", "token", "token_str", "sequence"}


def check_fill_mask(body: Any, text: str, top_k: int, expected_model: str | None = None) -> str | None:
    """One ranked list of `top_k` `{"score", "token", "token_str", "sequence"}` per [MASK] in `text`."""
    error = _check_model(body, expected_model)
    if error:
        return error
    predictions = body["predictions"]
    n_masks = text.count(MASK_TOKEN)
    if len(predictions) != n_masks:
        return f"{len(predictions)} prediction lists for {n_masks} [MASK] tokens"
    for m, ranked in enumerate(predictions):
        where = f"mask {m}"
        if not isinstance(ranked, list):
            return f"{where}: {type(ranked).__name__}, expected a list"
        if len(ranked) != top_k:
            return f"{where}: {len(ranked)} predictions, asked for top_k={top_k}"
        scores = []
        for i, item in enumerate(ranked):
            if not isinstance(item, dict) or set(item) != _MASK_KEYS:
                keys = sorted(item) if isinstance(item, dict) else type(item).__name__
                return f"{where}, prediction {i}: keys {keys}, expected {sorted(_MASK_KEYS)}"
            if not _is_number(item["score"]):
                return f"{where}, prediction {i}: score {item['score']!r} is not a finite number"
            if not isinstance(item["token"], int) or isinstance(item["token"], bool) or item["token"] < 0:
                return f"{where}, prediction {i}: token {item['token']!r} is not a vocabulary id"
            if not isinstance(item["token_str"], str) or not isinstance(item["sequence"], str):
                return f"{where}, prediction {i}: token_str and sequence must be strings"
            # (a random test model may rank [MASK] itself among its candidates: that is no error)
            if n_masks == 1 and MASK_TOKEN in item["sequence"] and MASK_TOKEN not in item["token_str"]:
                return f"{where}, prediction {i}: sequence still holds the [MASK]: {item['sequence']!r}"
            scores.append(float(item["score"]))
        tokens = [item["token"] for item in ranked]
        if len(set(tokens)) != len(tokens):
            return f"{where}: duplicate tokens {tokens}"
        error = _check_scores(scores, where)
        if error:
            return error
    return None
