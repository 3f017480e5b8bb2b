"""The int8 (CPU) and fp16 (CUDA) variants of an exported fp32 model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

log = logging.getLogger(__name__)

# Recorded in each int8 file's metadata (`gmlp.int8`), so the service knows without the onnx package
# whether rows of a batch are independent: with dynamic quantisation they are not.
STATIC, DYNAMIC = "static", "dynamic"
# ORT's settings of the int8 variant (why each: `quantize_int8`): the weights' in both modes, and
# the static mode's activations; docs/benchmarks.md ("int8 on CPUs without VNNI") compares
# activation/weight types over these.
INT8_WEIGHT_OPTIONS = {
    "weight_type": QuantType.QInt8,
    "per_channel": True,
    "reduce_range": True,
    "extra_options": {"MatMulConstBOnly": True},
}
STATIC_INT8_OPTIONS = {
    **INT8_WEIGHT_OPTIONS,
    "quant_format": QuantFormat.QDQ,
    "op_types_to_quantize": ["MatMul"],
    "activation_type": QuantType.QUInt8,
    "calibrate_method": CalibrationMethod.MinMax,
}


class FeedsReader(CalibrationDataReader):
    """ORT's calibration interface over a list of prepared feeds."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize_int8(
    fp32_path: str | Path, out_path: str | Path, calibration: Sequence[dict[str, np.ndarray]] | None = None
) -> str:
    """Quantise the channel projections (MatMuls with a constant weight) to int8; returns the mode.

    Weights are int8 with per-channel scales (accuracy on the wide d_ffn projections), in 7 bits
    (`reduce_range`): on x86 CPUs without VNNI ONNX Runtime adds pairs of u8 x s8 products in
    int16, which 8-bit weights saturate, and 2 x 255 x 64 < 2**15 (docs/export.md, "Variants").
    Activations: with `calibration` (inputs prepared like requests, contract/calibration.py)
    *static* QDQ, scales fixed at export, so the service can batch int8 requests; without, *dynamic*
    (one scale per run over the whole batch), which the service runs one row at a time. Neither
    touches the spatial projection inside the SGU function: W stays fp32.
    """
    if calibration:
        quantize_static(str(fp32_path), str(out_path), FeedsReader(calibration), **STATIC_INT8_OPTIONS)
        return STATIC
    quantize_dynamic(str(fp32_path), str(out_path), **INT8_WEIGHT_OPTIONS)
    return DYNAMIC
