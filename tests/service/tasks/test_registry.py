"""Every task of the contract is served by one registered pipeline with what the transports
call (its v2 forms, its Hugging Face API answer) and a default-model setting, checked on the
tiny models of each task."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.formats import TASKS
from contract.spec import read_spec
from service.settings import ServiceSettings
from service.tasks.forms import Forms
from service.tasks.pipeline import Pipeline
from service.tasks.registry import PIPELINES, load_pipeline
from service.telemetry.metrics import ServiceMetrics

SERVED = {"image-classification": "tiny_vision_served", "fill-mask": "tiny_mlm_served"}


def test_every_task_has_a_pipeline_and_a_default_model_setting() -> None:
    assert set(PIPELINES) == set(TASKS) == set(SERVED)
    for task, pipeline in PIPELINES.items():
        assert issubclass(pipeline, Pipeline) and pipeline.task == task
        assert pipeline.default_setting in ServiceSettings.model_fields, task
        assert ServiceSettings.model_fields[pipeline.default_setting].default is None


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_its_v2_forms_and_hf_answer(request: pytest.FixtureRequest, task: str) -> None:
    directory: Path = request.getfixturevalue(SERVED[task])
    spec = read_spec(directory)
    assert spec is not None and spec.task == task
    settings = ServiceSettings(variant="fp32", max_batch_size=2)
    served = load_pipeline(spec, settings, "cpu", ServiceMetrics(settings.max_batch_size), "1")
    assert type(served) is PIPELINES[task]
    forms = served.v2
    assert isinstance(forms, Forms) and type(forms).run_encoded is not Forms.run_encoded
    graph = forms.inputs(encoded=False)
    assert sorted(t["name"] for t in graph) == sorted(served.runtime.input_names)
    assert [(t["name"], t["datatype"]) for t in forms.inputs(encoded=True)] == [
        (forms.encoded_input, "BYTES")
    ]
    assert [t["name"] for t in forms.outputs()][: len(served.runtime.output_names)] == list(
        served.runtime.output_names
    )
    assert isinstance(served.hf_text_input, bool)
    assert type(served).hf_answer is not Pipeline.hf_answer
