"""Answers from the graph's top-k outputs equal the full-row answers on the same requests (the
same tokens and labels in the same order, ties included; scores within float rounding); rows
with `targets`, a top_k above K or another score function take the full rows; a directory
exported without the outputs (no K in its config.json) serves as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.spec import read_spec
from export import export_served_model
from service.engine.rows import NOTHING, Job
from service.settings import ServiceSettings
from service.tasks.fill_mask import Decoding, FillMaskPipeline
from service.tasks.pipeline import Pipeline
from service.tasks.registry import load_pipeline
from service.tasks.vision import Ranking, VisionPipeline
from service.telemetry.metrics import ServiceMetrics
from support.helpers import assert_same_answers
from support.top_k_models import tied_checkpoint

pytestmark = pytest.mark.timeout(300)

TEXTS = ["the [MASK] is here.", "a [MASK] and a [MASK] went out.", "[MASK]", "it was [MASK] again."]


def _pipeline(served: Path, settings: ServiceSettings) -> Pipeline:
    spec = read_spec(served)
    assert spec is not None
    return load_pipeline(spec, settings, "cpu", ServiceMetrics(settings.max_batch_size), "1")


@pytest.fixture(scope="module")
def old_and_tied(
    tmp_path_factory: pytest.TempPathFactory, tiny_mlm_checkpoint: Path, tiny_vision_checkpoint: Path
):
    """A masked LM with tied best candidates, and both tiny models exported without top-k outputs."""
    root = tmp_path_factory.mktemp("top-k-serving")
    tied = tied_checkpoint(tiny_mlm_checkpoint, root, list(range(2000, 2040)))
    export_served_model(tied, root / "tied-mlm", ["fp32", "int8"])
    export_served_model(tiny_mlm_checkpoint, root / "old-mlm", ["fp32", "int8"], top_k=0)
    export_served_model(tiny_vision_checkpoint, root / "old-vision", ["fp32", "int8"], top_k=0)
    return root


def _mlm_jobs(pipeline: FillMaskPipeline) -> list[Job]:
    codec = pipeline.codec
    encoded = [codec.encode(text) for text in TEXTS]
    asks = [(5, None), (32, None), (3, codec.target_ids(["dog", "cat"])), (40, None)]
    return [Job(e.feeds, Decoding(e, k, t), True, NOTHING) for e, (k, t) in zip(encoded, asks, strict=True)]


def _full_row_answers(pipeline: Pipeline, jobs: list[Job]) -> list:
    """Today's path on the same batch: every output, every row answered from its logits."""
    outputs = pipeline.run_rows([job.feeds for job in jobs])
    return pipeline.finish(jobs, outputs, [False] * len(jobs))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
@pytest.mark.parametrize("model", ["tiny", "tied"])
def test_masked_lm_answers_from_top_k_equal_full_rows(
    tiny_mlm_served: Path,
    old_and_tied: Path,
    make_settings: Callable[..., ServiceSettings],
    variant: str,
    model: str,
) -> None:
    served = tiny_mlm_served if model == "tiny" else old_and_tied / "tied-mlm"
    pipeline = _pipeline(served, make_settings(variant=variant))
    assert isinstance(pipeline, FillMaskPipeline) and pipeline.graph_top_k == 32
    jobs = _mlm_jobs(pipeline)
    qualifying = [jobs[0], jobs[1]]  # top_k <= K, no targets: the batch runs the top-k pair alone
    done = pipeline.run_batch(qualifying)
    assert all(set(d.outputs) == {TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT} for d in done)
    for d, expected in zip(done, _full_row_answers(pipeline, qualifying), strict=True):
        assert_same_answers(d.answer, expected)
    if model == "tied":  # the tied ids, in index order, lead every [MASK]'s answer
        assert [p["token"] for p in done[1].answer[0]] == list(range(2000, 2032))
    mixed = pipeline.run_batch(jobs)  # targets and top_k > K: the logits come out too
    assert "logits" in mixed[0].outputs
    for d, expected in zip(mixed, _full_row_answers(pipeline, jobs), strict=True):
        assert_same_answers(d.answer, expected)
    assert [len(slot) for slot in mixed[3].answer] == [40]


def test_classifier_answers_from_top_k_equal_full_rows(
    tiny_vision_served: Path, make_settings: Callable[..., ServiceSettings], cifar_images: list[bytes]
) -> None:
    pipeline = _pipeline(tiny_vision_served, make_settings(variant="fp32"))
    assert isinstance(pipeline, VisionPipeline) and pipeline.graph_top_k == 10
    pixels = [pipeline.transform(image) for image in cifar_images[:6]]
    jobs = [
        Job({"pixel_values": p}, Ranking(k), True, NOTHING)
        for p, k in zip(pixels, [1, 3, 10, 5, 2, 10], strict=True)
    ]
    jobs.append(Job(jobs[0].feeds, Ranking(4), True, NOTHING))  # an equal image: tied rows
    done = pipeline.run_batch(jobs)
    assert all("logits" not in d.outputs for d in done)
    for d, expected in zip(done, _full_row_answers(pipeline, jobs), strict=True):
        assert_same_answers(d.answer, expected)
    sigmoid = [Job(jobs[1].feeds, Ranking(3, "sigmoid"), True, NOTHING), jobs[2]]
    done = pipeline.run_batch(sigmoid)
    assert "logits" in done[0].outputs
    for d, expected in zip(done, _full_row_answers(pipeline, sigmoid), strict=True):
        assert_same_answers(d.answer, expected)


def test_directories_without_top_k_outputs_serve_as_before(
    tiny_mlm_served: Path,
    tiny_vision_served: Path,
    old_and_tied: Path,
    make_settings: Callable[..., ServiceSettings],
    cifar_images: list[bytes],
) -> None:
    for variant in ("fp32", "int8"):
        settings = make_settings(variant=variant)
        old, new = _pipeline(old_and_tied / "old-mlm", settings), _pipeline(tiny_mlm_served, settings)
        assert isinstance(old, FillMaskPipeline) and isinstance(new, FillMaskPipeline)
        assert old.graph_top_k == 0 and old.runtime.output_names == ["logits"]
        old_done, new_done = old.run_batch(_mlm_jobs(old)), new.run_batch(_mlm_jobs(new))
        for o, n in zip(old_done, new_done, strict=True):
            assert set(o.outputs) == {"logits"}
            assert_same_answers(o.answer, n.answer)
        old_v, new_v = (
            _pipeline(old_and_tied / "old-vision", settings),
            _pipeline(tiny_vision_served, settings),
        )
        assert (
            isinstance(old_v, VisionPipeline) and isinstance(new_v, VisionPipeline) and old_v.graph_top_k == 0
        )
        jobs = [
            Job({"pixel_values": old_v.transform(im)}, Ranking(3), True, NOTHING) for im in cifar_images[:4]
        ]
        for o, n in zip(old_v.run_batch(jobs), new_v.run_batch(jobs), strict=True):
            assert_same_answers(o.answer, n.answer)
