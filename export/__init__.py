"""gMLP checkpoint -> ONNX served-model directory (fused SGU function nodes, int8/fp16 variants)."""

import logging as _logging

from .directory import export_served_model
from .verify import ExportCheckError, ParityReport

# torch's exporter warns once per missing torchvision op; none of them is used by gMLP.
_logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(_logging.ERROR)

__all__ = ["ExportCheckError", "ParityReport", "export_served_model"]
