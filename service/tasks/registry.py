"""The tasks the service serves, keyed by the task names of `contract.formats.TASKS`.

A served directory's config names its task; `load_pipeline` builds that task's pipeline, whose
adapters (`v2`, `hf`) the transports call. A new task is one module beside `vision.py` and
`fill_mask.py` and one entry here (CONTRIBUTING.md); tests/service/tasks/test_registry.py checks
that every task of the contract has one, with all its adapters and a default-model setting.
"""

from __future__ import annotations

from contract.formats import MLM_TASK, VISION_TASK
from contract.spec import ModelSpec
from service.engine.runtime import Abandon
from service.settings import ServiceSettings
from service.tasks.fill_mask import FillMaskPipeline
from service.tasks.pipeline import Pipeline
from service.tasks.vision import VisionPipeline
from service.telemetry.metrics import ServiceMetrics

PIPELINES: dict[str, type[Pipeline]] = {VISION_TASK: VisionPipeline, MLM_TASK: FillMaskPipeline}


def load_pipeline(
    spec: ModelSpec,
    settings: ServiceSettings,
    device: str,
    metrics: ServiceMetrics,
    version: str,
    abandon: Abandon | None = None,
) -> Pipeline:
    """Create the session, warm it up and check it against its recorded check (blocking; call from
    a thread); once `abandon` is abandoned, its runs fail and so does the load."""
    model = PIPELINES[spec.task].open(spec, settings, device, metrics, version, abandon)
    model.warm_up()
    model.verify()
    return model
