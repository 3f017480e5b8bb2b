"""The answers a batch thread works out for a whole batch at once are, row by row, those of one
request scored alone: a classifier's batch mixing score functions, top_k and raw-output rows, and
a masked LM's batch mixing texts, mask counts, top_k and targets, on the tiny models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from contract.scores import SCORE_FUNCTIONS, ranked
from contract.spec import read_spec
from service.engine.rows import Job
from service.settings import ServiceSettings
from service.tasks.fill_mask import Decoding, FillMaskPipeline
from service.tasks.pipeline import Pipeline
from service.tasks.registry import load_pipeline
from service.tasks.vision import Ranking, VisionPipeline
from service.telemetry.metrics import ServiceMetrics
from support.helpers import assert_same_answers


def _pipeline(served: Path, settings: ServiceSettings) -> Pipeline:
    spec = read_spec(served)
    assert spec is not None
    return load_pipeline(spec, settings, "cpu", ServiceMetrics(settings.max_batch_size), "1")


def test_classifier_batch_answers_equal_per_request_ranking(
    tiny_vision_served: Path, make_settings: Callable[..., ServiceSettings], cifar_images: list[bytes]
) -> None:
    pipeline = _pipeline(tiny_vision_served, make_settings(variant="fp32"))
    assert isinstance(pipeline, VisionPipeline)
    asks = [
        Ranking(3),
        Ranking(10, "sigmoid"),
        None,
        Ranking(1),
        Ranking(5, "none"),
        Ranking(10),
        None,
        Ranking(2),
    ]
    jobs = [
        Job({"pixel_values": pipeline.transform(image)}, ask, observed=ask is not None)
        for image, ask in zip(cifar_images, asks, strict=False)
    ]
    # Two equal images: tied rows across the batch rank alike.
    jobs.append(Job(jobs[0].feeds, Ranking(4), observed=True))
    done = pipeline.run_batch(jobs)
    assert len(done) == len(jobs)
    for job, row in zip(jobs, done, strict=True):
        logits = row.outputs["logits"]
        assert logits.shape == (len(pipeline.labels),)
        if job.answer is None:
            assert row.answer is None
            continue
        assert isinstance(job.answer, Ranking)
        scores = SCORE_FUNCTIONS[job.answer.function](logits)
        expected = [
            {"label": pipeline.labels[i], "score": float(scores[i])} for i in ranked(scores, job.answer.top_k)
        ]
        assert_same_answers(row.answer, expected)
        start, end = row.finished
        assert 0 < start <= end


def test_masked_lm_batch_answers_equal_per_request_decoding(
    tiny_mlm_served: Path, make_settings: Callable[..., ServiceSettings]
) -> None:
    pipeline = _pipeline(tiny_mlm_served, make_settings(variant="fp32"))
    assert isinstance(pipeline, FillMaskPipeline)
    codec = pipeline.codec
    texts = ["the [MASK] is here.", "a [MASK] and a [MASK] went out.", "[MASK]", "it was [MASK] again."]
    targets = [None, None, codec.target_ids(["dog", "cat", "house"]), None]
    top_ks = [5, 2, 3, 12]
    encoded = [codec.encode(text) for text in texts]
    jobs = [
        Job(e.feeds, Decoding(e, k, t), observed=True)
        for e, k, t in zip(encoded, top_ks, targets, strict=True)
    ]
    jobs.insert(2, Job(encoded[0].feeds))  # a raw-output row among them
    done = pipeline.run_batch(jobs)
    assert done[2].answer is None
    answered = [d for j, d in zip(jobs, done, strict=True) if j.answer is not None]
    for e, k, t, row in zip(encoded, top_ks, targets, answered, strict=True):
        assert_same_answers(row.answer, codec.decode(e, row.outputs["logits"], k, t))
        assert [len(per_mask) for per_mask in row.answer] == [min(k, len(t or range(k)))] * len(
            e.mask_positions
        )
    np.testing.assert_array_equal(done[2].outputs["logits"], done[0].outputs["logits"])
