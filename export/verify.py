"""Checks an exported model must pass: graph structure, ORT's optimised graph, parity with PyTorch;
and the served graph for runtimes that know no ONNX local functions.

Used by `gmlp export` (a model that fails is not written) and by the tests.

OpenVINO's ONNX reader, TensorRT's parser and most converters know no local functions:
`write_inlined` writes a copy of a served variant with every `gmlp::SpatialGatingUnit` node
replaced by its body, the operators ONNX Runtime runs after its own inlining (docs/export.md).
When OpenVINO is installed, the export also runs the fp32 graph on it at the precision it chooses
on this CPU (bf16 where the CPU has bf16 instructions, else fp32) and holds it to PyTorch within
that precision's bound; config.json records what was checked (`openvino`).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
from torch import nn

from contract.check import CHECK_FILE, write_check
from contract.cpu import OPENVINO_PRECISIONS
from contract.errors import UserError
from contract.external_data import refuse_external_data
from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.scores import top_k_mismatch
from contract.spec import SpecError, read_spec
from model.checkpoint import GMLPModel
from model.configs import GMLPConfig, GMLPMaskedLMConfig

from .onnx_export import DOMAIN, OP_TYPE, PREDICTIONS_AXIS, SEQ_AXIS, example_inputs


class ExportCheckError(UserError):
    """An exported model failed a check; the message names the check."""


# The top-k outputs against the softmax of the same run's logits (float32 rounding of the graph's
# tail), and, for fp32, against PyTorch's (whose logits differ by up to the fp32 parity bound).
TOP_K_OWN_TOLERANCE = 1e-5
TOP_K_TORCH_TOLERANCE = 3e-4

# A runtime on the graph: batched inputs -> every output by name.
Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

# What `InferenceSession.run` raises for inputs the graph cannot take.
ORT_RUN_ERRORS = (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.RuntimeException)


@dataclass
class ParityReport:
    variant: str
    max_abs_diff: float
    top1_agreement: float
    samples: int
    lengths: tuple[int, ...] = ()  # the sequence lengths checked (masked LM)
    top_k: int = 0  # K of the top-k outputs checked (0: the graph has none)

    def __str__(self) -> str:
        at = f" at L = {'/'.join(map(str, self.lengths))}" if self.lengths else ""
        top = f", top-{self.top_k} outputs checked" if self.top_k else ""
        return (
            f"{self.variant}: max |logit diff| {self.max_abs_diff:.2e}, "
            f"top-1 agreement {100 * self.top1_agreement:.1f}% over {self.samples} samples{at}{top}"
        )


def session(path: str | Path, optimized_path: Path | None = None) -> ort.InferenceSession:
    """ONNX Runtime (CPU) on the graph at `path`; with `optimized_path`, the graph it runs
    (ORT_ENABLE_ALL, its default) is written there. A graph whose external data reaches outside
    its directory is refused first (SpecError), as the service refuses it."""
    refuse_external_data(Path(path), "graph")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_run(path: str | Path) -> Run:
    """ONNX Runtime (CPU) on the graph at `path`."""
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(names, feeds), strict=True))


def torch_logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> np.ndarray:
    """PyTorch fp32 logits for graph inputs; a masked LM runs at its fixed window, `input_ids`
    padded to n, so a graph run at a shorter length is compared with the model as trained."""
    config = model.config
    with torch.no_grad():
        if isinstance(config, GMLPMaskedLMConfig):
            ids = inputs["input_ids"]
            window = F.pad(ids, (0, config.n - ids.shape[-1]), value=config.pad_token_id)
            return model(window, positions=inputs["mask_positions"]).float().numpy()
        return model(inputs["pixel_values"]).float().numpy()


def check_parity(
    model: GMLPModel,
    path: str | Path,
    variant: str,
    run: Run | None = None,
    top_k_tolerance: float = TOP_K_OWN_TOLERANCE,
) -> ParityReport:
    """Max abs logit difference and top-1 agreement between ORT (CPU; or `run`, another runtime on
    the graph) and PyTorch fp32 (at the fixed window), over batches of 1 and 8 and, for a masked
    LM, lengths from one token to n, each with one prediction and with all max_predictions; the
    top-k outputs, where the graph has them, checked by `check_top_k` (against the run's own
    logits within `top_k_tolerance`)."""
    run = run or ort_run(path)
    diffs, agree, total, k = [], 0, 0, 0
    config = model.config
    cases: list[dict[str, int]] = [{"batch": 1}, {"batch": 8}]
    if isinstance(config, GMLPMaskedLMConfig):
        n, most = config.n, config.max_predictions
        cases = [{"batch": 1, "length": n, "predictions": most}]
        cases += [
            {"batch": 8, "length": length, "predictions": p}
            for length in sorted({1, max(1, n // 8), max(1, n // 2), n})
            for p in (1, most)
        ]
    for i, case in enumerate(cases):
        inputs = example_inputs(model.config, seed=100 + i, **case)
        expected = torch_logits(model, inputs)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        try:
            outputs = run(feeds)
        except ORT_RUN_ERRORS as exc:  # e.g. a graph that does not really take this length
            raise ExportCheckError(f"{variant}: ONNX Runtime failed on inputs of {case}: {exc}") from exc
        got = outputs["logits"]
        if got.shape != expected.shape:
            raise ExportCheckError(
                f"{variant}: output shape {got.shape} for {case}, PyTorch gives {expected.shape}"
            )
        diffs.append(float(np.abs(got - expected).max()))
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        total += expected.argmax(-1).size
        if TOP_K_IDS_OUTPUT in outputs:
            reference = expected if variant == "fp32" else None
            k = check_top_k(outputs, reference, f"{variant} on {case}", top_k_tolerance)
    lengths = tuple(sorted({c["length"] for c in cases if "length" in c}))
    return ParityReport(variant, max(diffs), agree / total, total, lengths, k)


def check_top_k(
    outputs: dict[str, np.ndarray],
    torch_reference: np.ndarray | None,
    what: str,
    own_tolerance: float = TOP_K_OWN_TOLERANCE,
) -> int:
    """Raise ExportCheckError unless a run's `topk_ids` / `topk_scores` are the top k of
    PyTorch's softmax over the run's own logits within `own_tolerance` (and over
    `torch_reference`, PyTorch's logits of the same inputs, when given, within
    `TOP_K_TORCH_TOLERANCE`; `contract.scores.top_k_mismatch`); returns K."""
    ids, scores = outputs[TOP_K_IDS_OUTPUT], outputs[TOP_K_SCORES_OUTPUT]
    if ids.dtype != np.int64 or scores.dtype != np.float32 or ids.shape != scores.shape:
        raise ExportCheckError(
            f"{what}: top-k outputs are {ids.dtype} {ids.shape} / {scores.dtype} {scores.shape}; "
            "expected int64 and float32 of one shape"
        )
    references = [(outputs["logits"], own_tolerance, "its own logits")]
    if torch_reference is not None:
        references.append((torch_reference, TOP_K_TORCH_TOLERANCE, "PyTorch's logits"))
    for logits, tolerance, source in references:
        probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
        problem = top_k_mismatch(ids, scores, probabilities, tolerance)
        if problem is not None:
            raise ExportCheckError(f"{what}: against the softmax of {source}: {problem}")
    return int(ids.shape[-1])


def check_fused_graph(path: str | Path, config: GMLPConfig) -> None:
    """The fp32 graph contract: the checker passes, every block's SGU is one function node, and a
    masked LM's length and prediction axes are dynamic. Its external data is checked before
    `onnx.load` reads it (`refuse_external_data`)."""
    refuse_external_data(Path(path), "graph")
    proto = onnx.load(str(path))
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportCheckError(f"onnx.checker rejected {path}: {exc}") from exc
    sgu_nodes = [n for n in proto.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]
    if len(sgu_nodes) != config.depth:
        raise ExportCheckError(f"{path}: {len(sgu_nodes)} {DOMAIN}::{OP_TYPE} nodes, expected {config.depth}")
    functions = [f for f in proto.functions if f.domain == DOMAIN and f.name == OP_TYPE]
    if len(functions) != 1:
        raise ExportCheckError(f"{path}: expected one {DOMAIN}::{OP_TYPE} function, found {len(functions)}")
    if isinstance(config, GMLPMaskedLMConfig):
        values = (*proto.graph.input, *proto.graph.output)
        axes = {v.name: v.type.tensor_type.shape.dim[1].dim_param for v in values}
        wanted = {"input_ids": SEQ_AXIS, "mask_positions": PREDICTIONS_AXIS}
        wanted.update({v.name: PREDICTIONS_AXIS for v in proto.graph.output})
        if axes != wanted:
            raise ExportCheckError(f"{path}: axis 1 of inputs/outputs is {axes}, expected dynamic {wanted}")


def optimized_op_counts(path: str | Path) -> Counter:
    """Op types of the graph ONNX Runtime actually runs (ORT_ENABLE_ALL, CPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        session(path, Path(tmp) / "optimized.onnx")
        optimized = onnx.load(str(Path(tmp) / "optimized.onnx"))
    return Counter(n.op_type for n in optimized.graph.node)


def check_optimized_graph(path: str | Path, config: GMLPConfig) -> Counter:
    """After ORT inlines the SGU functions: GELU fused with its bias, no Transpose inside the blocks.

    One Transpose may remain outside the blocks (the patch embedding's [B, d, n] -> [B, n, d], or
    the tied decoder's view of the embedding matrix); any Transpose in a block would repeat with
    depth, so more than one means the blocks have some.
    """
    ops = optimized_op_counts(path)
    if ops.get("BiasGelu", 0) + ops.get("FastGelu", 0) < config.depth:
        raise ExportCheckError(f"ORT did not fuse GELU with its bias in every block: {dict(ops)}")
    if ops.get("Transpose", 0) > 1:
        raise ExportCheckError(f"ORT's optimised graph has {ops['Transpose']} Transpose nodes: {dict(ops)}")
    return ops


def record_check(config: GMLPConfig, directory: Path, variants: dict[str, str]) -> dict:
    """Run every written variant on the reference inputs recorded for the service's check
    (`contract.check`) and store inputs and outputs in `check.npz`; returns the config.json entry.
    The inputs: two rows, and for a masked LM the full window with every prediction slot and half
    of it with one."""
    shapes: dict[str, dict[str, int]] = {"rows": {}}
    if isinstance(config, GMLPMaskedLMConfig):
        shapes = {
            "full": {"length": config.n, "predictions": config.max_predictions},
            "half": {"length": max(1, config.n // 2), "predictions": 1},
        }
    cases = {
        case: {k: v.numpy() for k, v in example_inputs(config, batch=2, seed=7 + i, **shape).items()}
        for i, (case, shape) in enumerate(shapes.items())
    }
    outputs = {}
    for variant, file in variants.items():
        run = ort_run(directory / file)
        outputs[variant] = {case: run(feeds) for case, feeds in cases.items()}
    return write_check(directory / CHECK_FILE, cases, outputs)


# What OpenVINO's answers must meet: in fp32 what ONNX Runtime's fp32 graph meets (max |logit diff|
# against PyTorch), in a lower precision what the fp16 variant meets (top-1 agreement).
OPENVINO_FP32_TOLERANCE = 1e-4
OPENVINO_MIN_TOP1 = 0.95
# OpenVINO's CPU plugin computes the softmax in the graph's top-k tail with its own vectorised exp:
# in fp32 on a 2-vCPU AVX2 EPYC (no bf16) the demo masked LM's top-k scores differed from the
# float64 softmax of the same run's logits by 2.1e-5, twice ONNX Runtime's bound. An answer's
# scores are read to 4 decimals; ranks are still held to the reference's wherever it is not tied.
OPENVINO_TOP_K_OWN_TOLERANCE = 1e-4


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
    onnx.save(onnx.inliner.inline_local_functions(onnx.load(str(source))), str(target))
    return target


def check_openvino(model: GMLPModel, fp32_path: Path) -> tuple[ParityReport, dict[str, Any]] | None:
    """OpenVINO's answers on the inlined fp32 graph against PyTorch (`check_parity`'s cases) at the
    precision OpenVINO chooses on this CPU: the report and config.json's entry of it; None where
    OpenVINO is not installed. Raises ExportCheckError beyond that precision's bound."""
    if importlib.util.find_spec("openvino") is None:
        return None
    import openvino as ov

    core = ov.Core()
    refuse_external_data(fp32_path, "graph")
    proto = onnx.inliner.inline_local_functions(onnx.load(str(fp32_path)))
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
        report = check_parity(model, fp32_path, precision, run, OPENVINO_TOP_K_OWN_TOLERANCE)
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
