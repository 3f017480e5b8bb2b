"""The graph's top-k outputs: the top k of PyTorch's own softmax of the same inputs (ties in index
order), in every variant, with the tail left in float32 by quantisation; an export without them
(`top_k=0`) has `logits` alone; the recorded check tells tied reorderings from moved ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from contract.check import run_check, write_check
from contract.formats import GRAPH_TOP_K_KEY, TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from export import ExportCheckError, export_served_model
from export.onnx_export import example_inputs
from export.verify import (
    OPENVINO_TOP_K_OWN_TOLERANCE,
    TOP_K_OWN_TOLERANCE,
    check_top_k,
    session,
    torch_logits,
)
from gmlp.cli import main as gmlp
from model import load_checkpoint
from support.top_k_models import tied_checkpoint

pytestmark = pytest.mark.timeout(300)

# The row's best entries made equal: these ids' logits are exactly tied and above all others.
TIED = list(range(2000, 2040))


def torch_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """An independent reference: torch softmax over the row, then torch's top k (ties: lower id)."""
    probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=-1)
    # A stable descending sort, so that tied entries come in index order.
    order = torch.sort(probabilities, dim=-1, descending=True, stable=True).indices[..., :k]
    return order.numpy(), torch.gather(probabilities, -1, order).numpy()


def _run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


@pytest.fixture(scope="module")
def tied_mlm(tmp_path_factory: pytest.TempPathFactory, tiny_mlm_checkpoint: Path) -> Path:
    out = tmp_path_factory.mktemp("tied") / "tied-mlm"
    checkpoint = tied_checkpoint(tiny_mlm_checkpoint, out.parent, TIED)
    export_served_model(checkpoint, out, ["fp32", "int8", "fp16"])
    return out


def test_top_k_outputs_are_torch_softmax_top_k(
    tiny_mlm_served: Path, tiny_vision_served: Path, tiny_mlm_checkpoint: Path, tiny_vision_checkpoint: Path
) -> None:
    pairs = ((tiny_mlm_served, tiny_mlm_checkpoint), (tiny_vision_served, tiny_vision_checkpoint))
    for served, checkpoint in pairs:
        config = json.loads((served / "config.json").read_text())
        k = config[GRAPH_TOP_K_KEY]
        assert [o["name"] for o in config["outputs"]] == ["logits", TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT]
        model = load_checkpoint(checkpoint)
        inputs = example_inputs(model.config, batch=4, seed=3)
        got = _run(served / "model.onnx", {n: v.numpy() for n, v in inputs.items()})
        ids, probabilities = torch_top_k(torch_logits(model, inputs), k)
        assert got[TOP_K_IDS_OUTPUT].dtype == np.int64 and got[TOP_K_SCORES_OUTPUT].dtype == np.float32
        assert got[TOP_K_IDS_OUTPUT].shape == (*got["logits"].shape[:-1], k)
        np.testing.assert_allclose(got[TOP_K_SCORES_OUTPUT], probabilities, rtol=1e-4, atol=1e-7)
        # Random weights give no ties within the tolerance here: the ids are torch's exactly.
        np.testing.assert_array_equal(got[TOP_K_IDS_OUTPUT], ids)


def test_ties_come_in_index_order_in_every_variant(tied_mlm: Path, tiny_mlm_checkpoint: Path) -> None:
    model = load_checkpoint(tied_checkpoint(tiny_mlm_checkpoint, tied_mlm.parent, TIED))
    inputs = example_inputs(model.config, batch=3, seed=5, length=16, predictions=2)
    feeds = {n: v.numpy() for n, v in inputs.items()}
    ref_ids, ref_probabilities = torch_top_k(torch_logits(model, inputs), 32)
    np.testing.assert_array_equal(ref_ids, np.broadcast_to(TIED[:32], ref_ids.shape))
    for file in ("model.onnx", "model.int8.onnx", "model.fp16.onnx"):
        got = _run(tied_mlm / file, feeds)
        np.testing.assert_array_equal(got[TOP_K_IDS_OUTPUT], ref_ids, err_msg=file)
        # Against the softmax of the variant's own logits, computed outside the graph.
        _, own = torch_top_k(got["logits"], 32)
        np.testing.assert_allclose(got[TOP_K_SCORES_OUTPUT], own, rtol=1e-5, atol=1e-8, err_msg=file)
        if file == "model.onnx":
            np.testing.assert_allclose(got[TOP_K_SCORES_OUTPUT], ref_probabilities, rtol=1e-4, atol=1e-7)


def test_quantisation_leaves_the_top_k_tail_in_float(tied_mlm: Path) -> None:
    """From `logits` to the top-k outputs, the int8 and fp16 graphs compute in float32/float64:
    no QuantizeLinear/DequantizeLinear, no half-precision tensor."""
    for file in ("model.int8.onnx", "model.fp16.onnx"):
        graph = onnx.shape_inference.infer_shapes(onnx.load(str(tied_mlm / file))).graph
        producer = {out: node for node in graph.node for out in node.output}
        types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
        tail, frontier = [], [TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT]
        while frontier:
            name = frontier.pop()
            node = producer.get(name)
            if name == "logits" or node is None or node in tail:
                continue
            tail.append(node)
            frontier += [i for i in node.input if i]
        ops = {node.op_type for node in tail}
        assert ops and ops <= {"TopK", "ReduceLogSumExp", "Sub", "Exp", "Cast", "Constant"}, (file, ops)
        halves = [t for n in tail for t in n.output if types.get(t) == onnx.TensorProto.FLOAT16]
        assert not halves, (file, halves)


def test_export_command_sets_or_drops_k(tmp_path: Path, tiny_vision_checkpoint: Path, capsys) -> None:
    """`--top-k 3` gives K = 3, `--top-k 0` `logits` alone (no `graph_top_k`), a negative K is refused."""
    for k, names in ((3, ["logits", TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT]), (0, ["logits"])):
        out = tmp_path / f"k{k}"
        argv = [
            "export",
            str(tiny_vision_checkpoint),
            "--out",
            str(out),
            "--variants",
            "fp32",
            "--top-k",
            str(k),
        ]
        assert gmlp(argv) == 0
        config = json.loads((out / "config.json").read_text())
        assert config.get(GRAPH_TOP_K_KEY) == (k or None) and [o["name"] for o in config["outputs"]] == names
        sess = session(out / "model.onnx")
        assert [o.name for o in sess.get_outputs()] == names
        assert all(o.shape[-1] == k for o in sess.get_outputs()[1:])
    assert "top-3 outputs checked" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gmlp(["export", str(tiny_vision_checkpoint), "--out", str(tmp_path / "never"), "--top-k", "-1"])
    assert "--top-k takes a whole number >= 0" in capsys.readouterr().err


def test_the_recorded_check_allows_tied_reorderings_only(tmp_path: Path) -> None:
    """Recorded scores 0.5, 0.2, 0.2, 0.1 (ranks 1 and 2 tied): swapping those passes, swapping
    ranks 0 and 1 is a moved answer, and so is a score off by more than the tolerance."""
    feeds = {"x": np.zeros((1, 1), np.float32)}
    ids = np.array([[7, 3, 9, 4]], np.int64)
    scores = np.array([[0.5, 0.2, 0.2, 0.1]], np.float32)
    entry = write_check(
        tmp_path / "check.npz",
        {"c": feeds},
        {"fp32": {"c": {TOP_K_IDS_OUTPUT: ids, TOP_K_SCORES_OUTPUT: scores}}},
    )

    def replay(order: list[int], shift: float = 0.0) -> str | None:
        outputs = {TOP_K_IDS_OUTPUT: ids[:, order], TOP_K_SCORES_OUTPUT: scores[:, order] + shift}
        return run_check(tmp_path, entry, "fp32", lambda _: outputs)

    assert replay([0, 1, 2, 3]) is None
    assert replay([0, 2, 1, 3]) is None
    moved = replay([1, 0, 2, 3])
    assert moved is not None and "topk_ids" in moved and "rank 0" in moved
    off = replay([0, 1, 2, 3], shift=0.01)
    assert off is not None and "topk_scores" in off


def test_openvino_s_own_top_k_scores_are_held_to_their_wider_bound() -> None:
    """Top-k scores 2e-5 off the float64 softmax of their own logits (as OpenVINO's fp32 exp gave
    on an AVX2 CPU) fail ONNX Runtime's bound and pass OpenVINO's; the least probable id in a
    top-k slot fails both."""
    logits = np.random.default_rng(0).standard_normal((2, 3, 50)).astype(np.float32)
    probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    ids = np.argsort(-probabilities, axis=-1)[..., :4].astype(np.int64)
    scores = (np.take_along_axis(probabilities, ids, axis=-1) + 2e-5).astype(np.float32)
    outputs = {"logits": logits, TOP_K_IDS_OUTPUT: ids, TOP_K_SCORES_OUTPUT: scores}
    assert TOP_K_OWN_TOLERANCE < 2e-5 < OPENVINO_TOP_K_OWN_TOLERANCE
    with pytest.raises(ExportCheckError, match="its own logits"):
        check_top_k(outputs, None, "ort")
    assert check_top_k(outputs, None, "openvino", OPENVINO_TOP_K_OWN_TOLERANCE) == 4
    swapped = ids.copy()
    swapped[0, 0, 0] = np.argsort(probabilities[0, 0])[0]
    with pytest.raises(ExportCheckError):
        check_top_k({**outputs, TOP_K_IDS_OUTPUT: swapped}, None, "openvino", OPENVINO_TOP_K_OWN_TOLERANCE)
