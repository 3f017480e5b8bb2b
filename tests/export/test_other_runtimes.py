"""The served graph for other runtimes: the inlined copy (`gmlp inline`) answers as the fused graph
through ONNX Runtime, and the export's OpenVINO check holds OpenVINO's answers to PyTorch's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from contract.spec import SpecError
from export import ExportCheckError
from export.onnx_export import example_inputs
from export.verify import check_openvino, write_inlined
from gmlp.cli import main as gmlp
from model import build_model, load_checkpoint
from support.helpers import perturbed

SGU = ("gmlp", "SpatialGatingUnit")


def run_all(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
@pytest.mark.parametrize("task", ["vision", "mlm"])
def test_inlined_copy_has_no_function_nodes_and_answers_as_the_fused_graph(
    tmp_path, tiny_vision_served, tiny_mlm_served, tiny_vision_checkpoint, tiny_mlm_checkpoint, task, variant
):
    served, checkpoint = {
        "vision": (tiny_vision_served, tiny_vision_checkpoint),
        "mlm": (tiny_mlm_served, tiny_mlm_checkpoint),
    }[task]
    assert gmlp(["inline", str(served), "--variant", variant, "--out", str(tmp_path)]) == 0
    fused_path = served / ("model.onnx" if variant == "fp32" else "model.int8.onnx")
    inlined_path = tmp_path / fused_path.name
    fused, inlined = onnx.load(str(fused_path)), onnx.load(str(inlined_path))
    depth = load_checkpoint(checkpoint).config.depth
    assert sum((n.domain, n.op_type) == SGU for n in fused.graph.node) == depth
    assert not inlined.functions
    assert {n.domain for n in inlined.graph.node} <= {"", "ai.onnx"}
    # gmlp.int8 and the rest of the metadata travel with it
    metadata = [[(p.key, p.value) for p in proto.metadata_props] for proto in (fused, inlined)]
    assert metadata[0] == metadata[1] and metadata[0]
    config = load_checkpoint(checkpoint).config
    shapes = [{"batch": 3}] if task == "vision" else [{"batch": 3, "length": n} for n in (config.n, 5)]
    for i, shape in enumerate(shapes):
        feeds = {k: v.numpy() for k, v in example_inputs(config, seed=40 + i, **shape).items()}
        want, got = run_all(fused_path, feeds), run_all(inlined_path, feeds)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_inlined_copy_never_replaces_the_fused_graph(tiny_vision_served, tmp_path):
    with pytest.raises(SpecError, match="fused graph itself"):
        write_inlined(tiny_vision_served, "fp32", tiny_vision_served)
    with pytest.raises(SpecError, match="no fp16 variant"):
        write_inlined(tiny_vision_served, "fp16", tmp_path)


@pytest.mark.parametrize("task", ["vision", "mlm"])
def test_export_records_openvino_checked_against_pytorch(tiny_vision_served, tiny_mlm_served, task):
    pytest.importorskip("openvino")
    served = tiny_vision_served if task == "vision" else tiny_mlm_served
    entry = json.loads((served / "config.json").read_text())["openvino"]
    assert entry["precision"] in ("fp32", "bf16")
    if entry["precision"] == "fp32":
        assert entry["max_abs_diff"] <= 1e-4
    assert entry["top1_agreement"] >= 0.95


def test_openvino_check_refuses_a_graph_that_is_not_the_model(tiny_vision_served, tiny_vision_checkpoint):
    pytest.importorskip("openvino")
    torch = pytest.importorskip("torch")
    torch.manual_seed(5)
    other = perturbed(build_model(load_checkpoint(tiny_vision_checkpoint).config))  # another model
    with pytest.raises(ExportCheckError, match="OpenVINO"):
        check_openvino(other, tiny_vision_served / "model.onnx")
