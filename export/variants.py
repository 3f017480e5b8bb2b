"""The int8 (CPU) and fp16 (CUDA) variants of an exported fp32 model."""

from __future__ import annotations

import logging
from pathlib import Path

from onnxruntime.quantization import QuantType, quantize_dynamic

log = logging.getLogger(__name__)

VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}


def quantize_int8(fp32_path: str | Path, out_path: str | Path) -> Path:
    """Dynamic int8 quantisation of the channel projections (MatMuls with a constant weight).

    The spatial projection lives inside the SGU function, which `quantize_dynamic` leaves as it
    is, so W stays fp32 and the function node survives in the int8 file. Activations are quantised
    per batch at run time (no calibration data needed); on CPUs with VNNI/AMX the int8 MatMuls are
    the fast path.
    """
    # Per-channel weight scales keep accuracy on the wide d_ffn projections.
    quantize_dynamic(
        str(fp32_path),
        str(out_path),
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"MatMulConstBOnly": True},
    )
    return Path(out_path)
