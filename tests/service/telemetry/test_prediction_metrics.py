"""Prediction-quality metrics (`gmlp_prediction_*`): what the models answered, checked against the
answers the clients got, on a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.spec import read_spec
from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)


def test_classifier_answers_are_counted_by_label_confidence_and_margin(
    start_server: Any, cifar_images: list[bytes], tiny_vision_served: Path
) -> None:
    server: RunningServer = start_server()
    labels = read_spec(tiny_vision_served).labels()
    with server.client() as client:
        answers = [
            client.post("/classify", params={"top_k": 2}, content=image).json()["predictions"]
            for image in cifar_images[:6]
        ]
    samples = server.metrics()
    series = {"model": "tiny-vision", "version": "1"}
    counted = {
        dict(key)["label"]: value
        for (name, key), value in samples.items()
        if name == "gmlp_prediction_top1_total" and dict(key)["model"] == "tiny-vision"
    }
    expected: dict[str, float] = {}
    for first, _ in answers:
        expected[first["label"]] = expected.get(first["label"], 0) + 1
    # Every label of the model has its series, at zero until it is a top-1 answer.
    assert {k: v for k, v in counted.items() if v} == expected and sorted(counted) == sorted(labels)
    assert server.metric("gmlp_prediction_confidence_count", **series) == 6
    assert server.metric("gmlp_prediction_confidence_sum", **series) == pytest.approx(
        sum(first["score"] for first, _ in answers), rel=1e-5
    )
    assert server.metric("gmlp_prediction_margin_sum", **series) == pytest.approx(
        sum(first["score"] - second["score"] for first, second in answers), rel=1e-4, abs=1e-6
    )


def test_fill_mask_answers_are_observed_per_mask(start_server: Any) -> None:
    server: RunningServer = start_server()
    with server.client() as client:
        predictions = client.post("/fill-mask", json={"text": "a [MASK] and a [MASK] .", "top_k": 2}).json()[
            "predictions"
        ]
    assert len(predictions) == 2
    series = {"model": "tiny-mlm", "version": "1"}
    assert server.metric("gmlp_prediction_confidence_count", **series) == 2
    assert server.metric("gmlp_prediction_confidence_sum", **series) == pytest.approx(
        sum(p[0]["score"] for p in predictions), rel=1e-4
    )
    # No label counts for a vocabulary: far too many values for a metric's label.
    assert not [
        k for k in server.metrics() if k[0] == "gmlp_prediction_top1_total" and ("model", "tiny-mlm") in k[1]
    ]
