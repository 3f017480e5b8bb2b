"""A served model whose graph never finishes a run: the good export's graphs with a Loop of 10^15
iterations (a float carried through an Add) folded into the logits, as a hostile or broken
export would make its warm-up burn a core for good. The loop starts from the input's mean, so
no optimiser can fold it away at load: it runs on every run."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from support.broken_dirs import copy_export

TRIPS = 10**15


def _endless(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    (logits,) = [o for o in graph.output if o.name == "logits"]
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["carried_in", "one"], ["carried_out"]),
        ],
        "endless_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried_out", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    first_input = graph.input[0].name
    for node in graph.node:  # the old logits become an inner value
        node.output[:] = ["logits_inner" if o == "logits" else o for o in node.output]
    graph.initializer.extend(
        [
            helper.make_tensor("trips", TensorProto.INT64, [], [TRIPS]),
            helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Cast", [first_input], ["input_float"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["input_float"], ["start"], keepdims=0),
            helper.make_node("Loop", ["trips", "keep_going", "start"], ["carried"], body=body),
            helper.make_node("Mul", ["carried", "zero"], ["nothing"]),
            helper.make_node("Add", ["logits_inner", "nothing"], [logits.name]),
        ]
    )
    return model


def endless_warm_up(good: Path, target: Path) -> Path:
    """A copy of the served directory `good` at `target` whose every graph runs forever."""
    copy_export(good, target)
    for graph_file in sorted(target.glob("*.onnx")):
        model = _endless(onnx.load(str(graph_file)))
        graph_file.unlink()  # a hard link: never write through it
        onnx.save(model, str(graph_file))
    return target
