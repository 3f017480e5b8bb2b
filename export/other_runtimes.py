"""The served graph for runtimes that know no ONNX local functions, and the export's OpenVINO check.

OpenVINO's ONNX reader, TensorRT's parser and most converters know no local functions:
`write_inlined` writes a copy of a served variant with every `gmlp::SpatialGatingUnit` node
replaced by its body, the operators ONNX Runtime runs after its own inlining (docs/export.md).
When OpenVINO is installed, the export also runs the fp32 graph on it at the precision it chooses
on this CPU (bf16 where the CPU has bf16 instructions, else fp32) and holds it to PyTorch within
that precision's bound; config.json records what was checked (`openvino`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner

from contract.cpu import OPENVINO_PRECISIONS
from contract.spec import SpecError, read_spec
from model.checkpoint import GMLPModel

from .verify import ExportCheckError, ParityReport, check_parity

# What OpenVINO's answers must meet: in fp32 what ONNX Runtime's fp32 graph meets (max |logit diff|
# against PyTorch), in a lower precision what the fp16 variant meets (top-1 agreement).
OPENVINO_FP32_TOLERANCE = 1e-4
OPENVINO_MIN_TOP1 = 0.95


def inlined(path: str | Path) -> onnx.ModelProto:
    """The graph of `path` with every ONNX local function call replaced by the function's body."""
    return onnx.inliner.inline_local_functions(onnx.load(str(path)))


def write_inlined(served_dir: Path, variant: str, out: Path) -> Path:
    """Write the inlined copy of a served directory's `variant` to `out` (a file, or a folder to
    hold `<variant file>` under its own name); returns the file written."""
    spec = read_spec(served_dir)
    if spec is None:
        raise SpecError(f"{served_dir} is not a served-model directory")
    if variant not in spec.variants:
        raise SpecError(f"{served_dir} has no {variant} variant (has {sorted(spec.variants)})")
    source = spec.variant_path(variant)
    target = out / source.name if out.is_dir() else out
    if target.resolve() == source.resolve():
        raise SpecError(f"{target} is the fused graph itself; write the inlined copy elsewhere")
    onnx.save(inlined(source), str(target))
    return target


def check_openvino(model: GMLPModel, fp32_path: Path) -> tuple[ParityReport, dict[str, Any]] | None:
    """OpenVINO's answers on the inlined fp32 graph against PyTorch (`check_parity`'s cases) at the
    precision OpenVINO chooses on this CPU: the report and config.json's entry of it; None where
    OpenVINO is not installed. Raises ExportCheckError beyond that precision's bound."""
    if importlib.util.find_spec("openvino") is None:
        return None
    import openvino as ov

    core = ov.Core()
    proto = inlined(fp32_path)
    compiled = core.compile_model(core.read_model(proto.SerializeToString(), b""), "CPU")
    hint = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    precision = OPENVINO_PRECISIONS.get(hint, hint)
    names = [value.name for value in proto.graph.output]
    # Below fp32 the graph's top-k scores are not the softmax of its logits to check_top_k's 1e-5:
    # only the logits are held to PyTorch's then.
    kept = names if precision == "fp32" else ["logits"]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        outputs = dict(zip(names, compiled(feeds).to_tuple(), strict=True))
        return {name: outputs[name] for name in kept}

    try:
        report = check_parity(model, fp32_path, precision, run)
    except ExportCheckError as exc:  # its top-k outputs, or a run, failed
        raise ExportCheckError(f"OpenVINO {exc}") from exc
    report.variant = f"OpenVINO {precision}"
    if precision == "fp32" and report.max_abs_diff > OPENVINO_FP32_TOLERANCE:
        raise ExportCheckError(f"{report}: more than {OPENVINO_FP32_TOLERANCE} from PyTorch's logits")
    if precision != "fp32" and report.top1_agreement < OPENVINO_MIN_TOP1:
        raise ExportCheckError(f"{report}: needs >= {100 * OPENVINO_MIN_TOP1:.0f}% top-1 agreement")
    return report, {
        "precision": precision,
        "max_abs_diff": report.max_abs_diff,
        "top1_agreement": report.top1_agreement,
    }
