"""The bare-pipeline benchmark on the tiny models: a short run of each task prints one well-formed
JSON object whose counts agree with each other and whose answers are the service's. Its figures
are never checked (a benchmark, not a test)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import bare_pipeline
from contract.scores import ranked, softmax
from loadtests.workload import load_images
from service.settings import ServiceSettings


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    bare_pipeline.main(
        ["--seconds", "0.2", "--rounds", "2", "--instances", "2", "--intra-op-threads", "1", *argv]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


def _check_counts(result: dict, batch: int = 16) -> None:
    assert result["instances"] == 2 and result["intra_op_threads"] == 1 and result["batch"] == batch
    assert [r["round"] for r in result["rounds"]] == [0, 1]
    for kind in ("bare", "raw"):
        runs = [r[kind] for r in result["rounds"]]
        for run in runs:
            assert run["batches"] >= 1
            assert run["requests"] == run["batches"] * result["batch"]
            assert math.isclose(run["requests_per_s"], run["requests"] / run["wall_s"])
            assert math.isclose(run["cpu_ms_per_request"], run["cpu_s"] * 1000.0 / run["requests"])
        for key in ("requests_per_s", "cpu_ms_per_request"):
            values = [run[key] for run in runs]
            assert min(values) <= result[kind][key] <= max(values)


def test_classify_run_is_well_formed(capsys, tiny_vision_served):
    result = _run(capsys, "--task", "classify", "--model-dir", str(tiny_vision_served), "--all-images")
    assert result["task"] == "classify" and result["model"] == "tiny-vision"
    assert result["inputs"] == len(load_images()[0])
    assert result["machine"].startswith("CPU: ")
    _check_counts(result)


def test_fill_mask_run_is_well_formed(capsys, tiny_mlm_served):
    result = _run(capsys, "--task", "fill-mask", "--model-dir", str(tiny_mlm_served))
    assert result["task"] == "fill-mask" and result["model"] == "tiny-mlm"
    assert 1 <= result["inputs"] <= len(bare_pipeline.sentences())
    _check_counts(result)


@pytest.mark.parametrize("task", ["classify", "fill-mask"])
def test_a_run_takes_its_batch_size(capsys, tiny_vision_served, tiny_mlm_served, task):
    model_dir = tiny_vision_served if task == "classify" else tiny_mlm_served
    result = _run(capsys, "--task", task, "--model-dir", str(model_dir), "--batch-size", "5")
    _check_counts(result, batch=5)


@pytest.mark.parametrize("from_top_k", [True, False], ids=["graph top-k", "logits"])
def test_bare_classify_answers_as_the_service_ranks(tiny_vision_served, from_top_k):
    """The bare batch's top 5 per image are the per-image softmax and ranking of its logits,
    whether built from the graph's top-k outputs (float32 scores) or from the logits (exact)."""
    images, _ = load_images()
    bare = bare_pipeline.BareClassify(tiny_vision_served, ServiceSettings(), images)
    assert bare.from_top_k, "the tiny classifier is exported with top-k outputs"
    if not from_top_k:
        bare.from_top_k, bare.outputs = False, ["logits"]
    answers = bare.bare(0)
    assert len(answers) == bare.batch
    pixels = np.stack([bare.transform(images[i % len(images)]) for i in range(bare.batch)])
    logits = bare.model.run({"pixel_values": pixels}, ["logits"])["logits"]
    for answer, row in zip(answers, logits, strict=True):
        probs = softmax(row)
        expected = [{"label": bare.labels[j], "score": float(probs[j])} for j in ranked(probs, len(answer))]
        assert [a["label"] for a in answer] == [e["label"] for e in expected]
        scores = [a["score"] for a in answer]
        if from_top_k:
            assert scores == pytest.approx([e["score"] for e in expected], rel=1e-5)
        else:
            assert answer == expected


def test_bare_fill_mask_answers_every_mask(tiny_mlm_served):
    bare = bare_pipeline.BareFillMask(tiny_mlm_served, ServiceSettings(), bare_pipeline.sentences())
    answers = bare.bare(0)
    assert len(answers) == bare.batch
    for answer in answers:
        assert [len(per_mask) for per_mask in answer] == [bare_pipeline.TOP_K]
        scores = [p["score"] for p in answer[0]]
        assert scores == sorted(scores, reverse=True)


def test_task_both_refuses_one_model_dir(tiny_vision_served):
    with pytest.raises(SystemExit, match="--task classify or --task fill-mask"):
        bare_pipeline.main(["--model-dir", str(tiny_vision_served)])
