"""External data of ONNX graphs (`contract.external_data`): every hostile location a repository's
writer can give a tensor (out of the directory, absolute, `/dev/zero` with a terabyte's length, a
symlink, a hard link, a FIFO, an offset past the end) is refused with a reason naming it, by the
check and by the repository scan, for any variant, and the file it aims at is never read; data
inside the directory passes. The walker finds every tensor `onnx`'s own parser finds, wherever
the graph keeps it, in files protobuf accepts after random damage too."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from contract.external_data import (
    MAX_EXTERNAL_PROBLEMS,
    GraphFormatError,
    external_data_problems,
    external_tensors,
    refuse_external_data,
)
from contract.scan import ModelSource, scan
from contract.spec import SpecError, read_spec
from support.broken_dirs import copy_export, outcome_within, release_readers
from support.external_graphs import HOSTILE, INSIDE_NAME, WEIGHTS, external_graph, outside_file, untouched

WAIT_S = 30.0


def _problems(graph: Path) -> list[str]:
    """`external_data_problems` within a bounded wait (a regression could block on a FIFO)."""
    found: list[list[str]] = []
    outcome = outcome_within(lambda: found.append(external_data_problems(graph, "variant fp32")), WAIT_S)
    assert outcome is None, repr(outcome)
    return found[0]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_location_is_refused_and_never_read(tmp_path: Path, case: str) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    outside = outside_file(tmp_path)
    words = HOSTILE[case](directory, outside, "model.onnx")
    graph = directory / "model.onnx"
    try:
        problems = _problems(graph)
        assert len(problems) == 1, problems
        assert words in problems[0] and f"variant fp32 {graph}: tensor 'w':" in problems[0]
        refused = outcome_within(lambda: refuse_external_data(graph, "graph"), WAIT_S)
        assert isinstance(refused, SpecError) and words in str(refused)
    finally:
        release_readers([directory / INSIDE_NAME] if case == "fifo" else [])
    assert untouched(outside)


def test_data_inside_the_directory_passes(tmp_path: Path) -> None:
    (tmp_path / INSIDE_NAME).write_bytes(WEIGHTS.tobytes())
    assert _problems(external_graph(tmp_path / "one.onnx", INSIDE_NAME, offset=0, length=16)) == []
    assert _problems(external_graph(tmp_path / "bare.onnx", INSIDE_NAME)) == []  # the whole file
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(WEIGHTS.tobytes())
    (tmp_path / "linked.bin").symlink_to(tmp_path / "sub" / "w.bin")  # a link that stays inside
    assert _problems(external_graph(tmp_path / "deep.onnx", "sub/w.bin")) == []
    assert _problems(external_graph(tmp_path / "link.onnx", "linked.bin")) == []
    # As onnx writes it: every tensor in one file beside the graph, at its own offset.
    model = _every_place_model(None)
    saved = tmp_path / "saved.onnx"
    onnx.save(
        model,
        saved,
        save_as_external_data=True,
        location="saved.data",
        size_threshold=0,
        convert_attribute=True,
    )
    assert len(_walked(saved)) >= 5 and _walked(saved) == _oracle(onnx.load(saved, load_external_data=False))
    assert _problems(saved) == []


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ({"location": INSIDE_NAME, "basepath": "/etc"}, "external data key 'basepath' is not one of"),
        ({"location": INSIDE_NAME, "offset": "+0"}, "offset '+0' is not a decimal number"),
        ({"location": INSIDE_NAME, "length": " 16"}, "length ' 16' is not a decimal number"),
        ({"location": INSIDE_NAME, "offset": "1_0"}, "offset '1_0' is not a decimal number"),
        ({"location": INSIDE_NAME, "offset": "-4"}, "offset '-4' is not a decimal number"),
        ({"location": INSIDE_NAME, "length": "٣"}, "is not a decimal number"),
        ({"offset": "0"}, "external data without a location"),
        ({"location": "x" * 5000}, "location over 4096 bytes"),
        ({"location": "missing.bin"}, "'missing.bin': cannot be read (No such file or directory)"),
        # ONNX Runtime reads an initializer from a memory address under this name.
        ({"location": "*/_ORT_MEM_ADDR_/*", "offset": "4096"}, "cannot be read"),
        ({"location": "a/../" + INSIDE_NAME}, "must be a path inside the model's directory"),
        ({"location": INSIDE_NAME + "\0../x"}, "expected a file name relative to"),
    ],
)
def test_malformed_entries_are_refused(tmp_path: Path, entries: dict[str, str], words: str) -> None:
    (tmp_path / INSIDE_NAME).write_bytes(WEIGHTS.tobytes())
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in entries.items():
        weight.external_data.add(key=key, value=value)
    (tmp_path / "g.onnx").write_bytes(_model([weight]).SerializeToString())
    problems = _problems(tmp_path / "g.onnx")
    assert len(problems) == 1 and words in problems[0], problems


def test_many_problems_are_counted_not_listed(tmp_path: Path) -> None:
    tensors = [_external(f"w{i}", f"/abs/{i}.bin") for i in range(10)]
    (tmp_path / "g.onnx").write_bytes(_model(tensors).SerializeToString())
    problems = _problems(tmp_path / "g.onnx")
    assert len(problems) == MAX_EXTERNAL_PROBLEMS + 1
    assert problems[-1] == f"and {10 - MAX_EXTERNAL_PROBLEMS} more tensors' external data"


def test_a_rewritten_graph_is_checked_again(tmp_path: Path) -> None:
    (tmp_path / INSIDE_NAME).write_bytes(WEIGHTS.tobytes())
    graph = external_graph(tmp_path / "g.onnx", INSIDE_NAME)
    assert _problems(graph) == []
    external_graph(graph, "../../../../outside/of/it.bin")
    assert "inside the model's directory" in _problems(graph)[0]


def test_a_file_that_is_no_protobuf_is_refused_at_use_and_left_to_the_load_by_the_scan(
    tmp_path: Path, tiny_vision_served: Path
) -> None:
    graph = external_graph(tmp_path / "g.onnx", INSIDE_NAME)
    graph.write_bytes(graph.read_bytes()[:-7])  # cut inside the tensor's entries
    with pytest.raises(GraphFormatError, match="truncated|past its message"):
        external_data_problems(graph, "graph")
    with pytest.raises(SpecError, match="not an ONNX model a runtime can read"):
        refuse_external_data(graph, "graph")
    served = copy_export(tiny_vision_served, tmp_path / "served")
    (served / "model.onnx").unlink()
    (served / "model.onnx").write_bytes(b"\x0a\xff\xff\xff\x0f not a graph")
    spec = read_spec(served)  # the scan finds no external data problem: the load says what it is
    assert spec is not None
    with pytest.raises(SpecError, match="not an ONNX model a runtime can read"):
        spec.variant_path("fp32")


@pytest.mark.parametrize("graph", ["model.onnx", "model.int8.onnx"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_scan_lists_each_hostile_version_unavailable(
    tmp_path: Path, tiny_vision_served: Path, case: str, graph: str
) -> None:
    repo = tmp_path / "models"
    copy_export(tiny_vision_served, repo / "good" / "1")
    version = copy_export(tiny_vision_served, repo / "hostile" / "1")
    outside = outside_file(tmp_path)
    words = HOSTILE[case](version, outside, graph)
    sources: dict[str, ModelSource] = {}
    try:
        outcome = outcome_within(lambda: sources.update(scan(repo)), WAIT_S)
        assert outcome is None, repr(outcome)
    finally:
        release_readers([version / INSIDE_NAME] if case == "fifo" else [])
    assert sources["good"].complete_versions() == [1]
    problem = sources["hostile"].versions[1].problem or ""
    assert sources["hostile"].complete_versions() == [] and words in problem, problem
    assert graph in problem and "tensor 'w'" in problem
    assert untouched(outside)


# -- the walker against onnx's own parser ------------------------------------------------------------


def _external(name: str, location: str) -> TensorProto:
    tensor = numpy_helper.from_array(WEIGHTS, name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return tensor


def _model(initializers: list[TensorProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _every_place_model(prefix: str | None) -> onnx.ModelProto:
    """Tensors in every place a runtime may load one from: an initializer, a sparse initializer's
    values and indices, a Constant's attribute, a custom node's list of tensors, an If branch's
    initializer, a local function's node, a training graph's initializer; each in external data
    at `prefix` + its name + `.bin` (None: each holds its bytes itself)."""

    def plain(name: str) -> TensorProto:
        return numpy_helper.from_array(WEIGHTS, name)

    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])
    branch = helper.make_graph(
        [helper.make_node("Identity", ["bw"], ["t"])], "b", [], [then_out], [plain("bw")]
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], value=plain("cw")),
        helper.make_node("Custom", ["x"], ["u"], domain="test", weights=[plain("lw0"), plain("lw1")]),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
        helper.make_node("Fn", ["x"], ["v"], domain="local"),
    ]
    indices = numpy_helper.from_array(np.array([0, 2], dtype=np.int64), "si")
    sparse = helper.make_sparse_tensor(plain("sv"), indices, [4])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph(nodes, "g", [x], [y], [plain("iw")], sparse_initializer=[sparse])
    body = [helper.make_node("Constant", [], ["v"], value=plain("fw"))]
    function = helper.make_function("local", "Fn", ["x"], ["v"], body, [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], functions=[function])
    training = model.training_info.add()
    training.initialization.CopyFrom(helper.make_graph([], "init", [], [], [plain("tw")]))
    for tensor in _onnx_tensors(model) if prefix is not None else ():
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=f"{prefix}{tensor.name}.bin")
    return model


def _onnx_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Every TensorProto of `model` as protobuf parsed it (the oracle the walker is held to)."""
    found: list[TensorProto] = []

    def graph(g: onnx.GraphProto) -> None:
        found.extend(g.initializer)
        for sparse in g.sparse_initializer:
            found.extend([sparse.values, sparse.indices])
        nodes(g.node)

    def nodes(node_list: list[onnx.NodeProto]) -> None:
        for node in node_list:
            attributes(node.attribute)

    def attributes(attribute_list: list[onnx.AttributeProto]) -> None:
        for a in attribute_list:
            found.extend([a.t] if a.HasField("t") else [])
            found.extend(a.tensors)
            for sparse in [*([a.sparse_tensor] if a.HasField("sparse_tensor") else []), *a.sparse_tensors]:
                found.extend([sparse.values, sparse.indices])
            for g in [*([a.g] if a.HasField("g") else []), *a.graphs]:
                graph(g)

    graph(model.graph)
    for function in model.functions:
        nodes(function.node)
        attributes(function.attribute_proto)
    for training in model.training_info:
        graph(training.initialization)
        graph(training.algorithm)
    return found


def _oracle(model: onnx.ModelProto) -> list[tuple[str, tuple[tuple[bytes, bytes | None], ...]]]:
    """The tensors naming external data as protobuf parsed them, in the walker's terms."""

    def raw(text: str | bytes) -> bytes:  # protobuf hands a string that is not UTF-8 over as bytes
        return text if isinstance(text, bytes) else text.encode()

    return sorted(
        (
            raw(t.name)[:200].decode("utf-8", "backslashreplace"),
            tuple((raw(e.key), raw(e.value)) for e in t.external_data),
        )
        for t in _onnx_tensors(model)
        if len(t.external_data) or t.data_location == TensorProto.EXTERNAL
    )


def _walked(path: Path) -> list[tuple[str, tuple[tuple[bytes, bytes | None], ...]]]:
    with open(path, "rb") as handle:
        return sorted((t.name, t.entries) for t in external_tensors(handle))


def test_the_walker_finds_every_tensor_onnx_finds(tmp_path: Path) -> None:
    model = _every_place_model("")
    (tmp_path / "g.onnx").write_bytes(model.SerializeToString())
    expected = _oracle(model)
    assert len(expected) == 10  # each place above holds one (two in the list of tensors, the sparse)
    assert _walked(tmp_path / "g.onnx") == expected
    assert len(_problems(tmp_path / "g.onnx")) == MAX_EXTERNAL_PROBLEMS + 1  # none of them is there


def _field(number: int, payload: bytes) -> bytes:
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_a_tensor_given_twice_where_protobuf_merges_them_is_refused(tmp_path: Path) -> None:
    """A Constant's `value` given twice: protobuf joins both into one tensor whose last location
    is the second's, which a walker taking each alone would not see."""
    first, second = _external("w", INSIDE_NAME), TensorProto()
    second.external_data.add(key="location", value="/etc/shadow")
    attribute = helper.make_attribute("value", first).SerializeToString() + _field(
        5, second.SerializeToString()
    )
    node = helper.make_node("Constant", [], ["y"]).SerializeToString() + _field(5, attribute)
    model = _model([]).SerializeToString() + _field(7, _field(1, node))
    merged = onnx.ModelProto.FromString(model).graph.node[-1].attribute[0].t
    assert [e.value for e in merged.external_data] == [INSIDE_NAME, "/etc/shadow"]
    (tmp_path / "g.onnx").write_bytes(model)
    with pytest.raises(GraphFormatError, match="given twice"):
        external_data_problems(tmp_path / "g.onnx", "graph")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10**6) | st.none(),
)
def test_a_damaged_file_protobuf_accepts_is_walked_as_protobuf_reads_it(
    tmp_path: Path, damage: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(_every_place_model("d/").SerializeToString())
    for position, value in damage:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut % len(data) :]
    path = tmp_path / "damaged.onnx"
    path.unlink(missing_ok=True)
    path.write_bytes(bytes(data))
    try:
        model = onnx.ModelProto.FromString(bytes(data))
    except Exception:  # protobuf refuses it: the walker may or may not, but never otherwise fails
        with contextlib.suppress(GraphFormatError):
            _walked(path)
        return
    assert _walked(path) == _oracle(model)  # GraphFormatError here: the walker refused it alone


def test_the_graphs_written_here_are_what_onnx_reads(tmp_path: Path) -> None:
    """The makers' graphs are real ONNX: the checker passes them and their data is w's bytes."""
    (tmp_path / INSIDE_NAME).write_bytes(WEIGHTS.tobytes())
    graph = external_graph(tmp_path / "g.onnx", INSIDE_NAME, offset=0, length=16)
    model = onnx.load(str(graph))
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), WEIGHTS)
    assert os.path.getsize(tmp_path / INSIDE_NAME) == 16
