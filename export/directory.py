"""Checkpoint directory -> served-model directory (docs/formats.md), verified before it is written:
the fp32 graph, and the int8 (CPU) and fp16 (CUDA) variants made of it.

Everything is first written to a temporary directory next to the destination and moved into place
only after all checks pass, so a failed export never leaves a half-written model for the service.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from contract.calibration import calibration_feeds
from contract.formats import CONFIG_FILE, DEFAULT_GRAPH_TOP_K, GRAPH_TOP_K_KEY, SERVED_FORMAT, VARIANT_FILES
from model.checkpoint import WEIGHTS_FILE, file_sha256, load_checkpoint
from model.configs import GMLPConfig, GMLPMaskedLMConfig

from .onnx_export import OPSET, export_onnx, graph_top_k, io_spec
from .verify import (
    ExportCheckError,
    ParityReport,
    check_fused_graph,
    check_openvino,
    check_optimized_graph,
    check_parity,
    record_check,
)

log = logging.getLogger(__name__)

FP32_TOLERANCE = 1e-4
# Lower-precision variants are judged on what a user sees: the top-1 class/token.
MIN_TOP1_AGREEMENT = {"int8": 0.8, "fp16": 0.95}


def export_served_model(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    variants: list[str] | tuple[str, ...] = ("fp32",),
    *,
    name: str | None = None,
    calibration: str | Path | None = None,
    calibration_samples: int = 256,
    top_k: int = DEFAULT_GRAPH_TOP_K,
) -> dict[str, ParityReport]:
    """Export, verify and write a served-model directory; returns the parity report per variant.

    `calibration` (images or prose, see contract/calibration.py; default: the checkpoint's own
    calibration set, if it has one) makes the int8 variant statically quantised, so the service can
    batch it; without any, int8 is dynamic. `top_k` > 0 gives every variant the top-k outputs
    (`topk_ids`, `topk_scores`; K = min(top_k, the row's length), recorded in config.json as
    `graph_top_k`); 0 exports `logits` alone.
    Raises ExportCheckError (and writes nothing) if the fp32 graph breaks its contract, fp32
    parity exceeds 1e-4, or a variant's top-1 agreement with PyTorch is too low.
    """
    unknown = set(variants) - set(VARIANT_FILES)
    if unknown:
        raise ExportCheckError(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANT_FILES)}")
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    model = load_checkpoint(checkpoint_dir)
    info = model.checkpoint_info
    config = model.config
    sha = file_sha256(checkpoint_dir / WEIGHTS_FILE)
    metadata = {
        "gmlp.config": json.dumps(config.to_dict()),
        "gmlp.task": config.task,
        "gmlp.source_sha256": sha,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    reports: dict[str, ParityReport] = {}
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}-") as tmp:
        staging = Path(tmp)
        k = graph_top_k(config, top_k)
        fp32 = export_onnx(model, staging / VARIANT_FILES["fp32"], metadata=metadata, top_k=k)
        check_fused_graph(fp32, config)
        check_optimized_graph(fp32, config)
        reports["fp32"] = check_parity(model, fp32, "fp32")
        if reports["fp32"].max_abs_diff > FP32_TOLERANCE:
            raise ExportCheckError(f"fp32 parity failed: {reports['fp32']} (tolerance {FP32_TOLERANCE})")
        served = _served_config(info, config, variants, sha, name or out_dir.name, k)
        if "int8" in variants:
            # The channel projections (MatMuls with a constant weight) quantised to int8: *static*
            # with calibration feeds (inputs prepared like requests), else *dynamic*. Why 7-bit
            # per-channel weights, what each mode means for batching, and why W stays fp32:
            # docs/export.md, "Variants".
            source, feeds = calibration_feeds(calibration, served, checkpoint_dir, calibration_samples)
            int8_path = str(staging / VARIANT_FILES["int8"])
            if source is not None and feeds:
                quantize_static(str(fp32), int8_path, FeedsReader(feeds), **STATIC_INT8_OPTIONS)
                served["int8_quantization"] = STATIC
                served["int8_calibration"] = {"source": source.name, "samples": len(feeds)}
            else:
                quantize_dynamic(str(fp32), int8_path, **INT8_WEIGHT_OPTIONS)
                served["int8_quantization"] = DYNAMIC
            int8 = onnx.load(int8_path)
            props = {p.key: p.value for p in int8.metadata_props} | metadata
            onnx.helper.set_model_props(int8, props | {"gmlp.int8": served["int8_quantization"]})
            onnx.save(int8, int8_path)
        if "fp16" in variants:
            export_onnx(model, staging / VARIANT_FILES["fp16"], float16=True, metadata=metadata, top_k=k)
        for variant in (v for v in variants if v != "fp32"):
            reports[variant] = check_parity(model, staging / VARIANT_FILES[variant], variant)
            if reports[variant].top1_agreement < MIN_TOP1_AGREEMENT[variant]:
                raise ExportCheckError(
                    f"{variant} check failed: {reports[variant]} "
                    f"(needs >= {100 * MIN_TOP1_AGREEMENT[variant]:.0f}% top-1 agreement)"
                )
        openvino = check_openvino(model, fp32)  # (report, config.json entry); None without OpenVINO
        if openvino is not None:
            reports["openvino"], served["openvino"] = openvino
        served["check"] = record_check(config, staging, served["variants"])
        (staging / CONFIG_FILE).write_text(json.dumps(served, indent=2) + "\n")
        for extra in ("labels", "tokenizer"):
            if extra in info:
                shutil.copyfile(checkpoint_dir / info[extra], staging / info[extra])
        if (checkpoint_dir / "README.md").is_file():
            shutil.copyfile(checkpoint_dir / "README.md", staging / "README.md")
        # The verified files replace an older export in `out_dir`, config.json last: a served
        # directory without it is incomplete, and a watching server (`GMLP_MODEL_CONTROL=poll`)
        # loads no version before it is there.
        if out_dir.exists():
            if not (out_dir / CONFIG_FILE).is_file() and any(out_dir.iterdir()):
                raise ExportCheckError(
                    f"{out_dir} exists and is not a served-model directory; not overwriting it"
                )
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        for item in sorted(staging.iterdir(), key=lambda p: p.name == CONFIG_FILE):
            shutil.move(str(item), out_dir / item.name)
    for report in reports.values():
        log.info("%s", report)
    return reports


# Recorded in each int8 file's metadata (`gmlp.int8`), so the service knows without the onnx package
# whether rows of a batch are independent: with dynamic quantisation they are not.
STATIC, DYNAMIC = "static", "dynamic"
# ORT's settings of the int8 variant (why each: docs/export.md): the weights' in both modes, and
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


def _served_config(
    info: dict, config: GMLPConfig, variants: Sequence[str], sha: str, name: str, top_k: int
) -> dict:
    inputs, outputs = io_spec(config, top_k)
    served = {
        "format": SERVED_FORMAT,
        "format_version": 2,
        "name": name,
        "task": config.task,
        "seq_len": config.seq_len,
        "model": config.to_dict(),
        "preprocessing": info.get("preprocessing", {}),
        "variants": {v: VARIANT_FILES[v] for v in VARIANT_FILES if v in variants or v == "fp32"},
        "inputs": inputs,
        "outputs": outputs,
        "source_sha256": sha,
        "opset": OPSET,
    }
    if top_k:
        served[GRAPH_TOP_K_KEY] = top_k
    if isinstance(config, GMLPMaskedLMConfig):
        served.update(
            tokenizer=info["tokenizer"],
            max_predictions=config.max_predictions,
            pad_token_id=config.pad_token_id,
            mask_token_id=config.mask_token_id,
            vocab_size=config.vocab_size,
        )
    else:
        served["labels"] = info["labels"]
    return served
