"""The runtime door (`open_runtime`) on each backend: a graph whose external data reaches outside
its directory (tests/support/external_graphs.py) is refused before the runtime opens it, with the
reason, and the file it aims at is never read, though it holds the very bytes the graph expects
(ONNX Runtime would load the hard-linked one); a graph whose data lies beside it loads and runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.spec import SpecError
from service.engine.backends import open_runtime
from service.engine.runtime import ONNXRUNTIME, OPENVINO, RuntimeOptions
from support.broken_dirs import outcome_within, release_readers
from support.external_graphs import HOSTILE, INSIDE_NAME, WEIGHTS, external_graph, outside_file, untouched

BACKENDS = [ONNXRUNTIME, OPENVINO]


def _options(backend: str) -> RuntimeOptions:
    if backend == OPENVINO:
        pytest.importorskip("openvino")
    return RuntimeOptions(intra_op_threads=1, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_graph_with_outside_data_is_refused_by_each_backend(
    tmp_path: Path, backend: str, case: str
) -> None:
    options = _options(backend)
    directory = tmp_path / "model"
    directory.mkdir()
    outside = outside_file(tmp_path)
    words = HOSTILE[case](directory, outside, "model.onnx")
    try:
        refused = outcome_within(lambda: open_runtime(directory / "model.onnx", options), 30)
    finally:
        release_readers([directory / INSIDE_NAME] if case == "fifo" else [])
    assert isinstance(refused, SpecError), repr(refused)
    assert words in str(refused) and "tensor 'w'" in str(refused)
    assert untouched(outside)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_with_its_data_beside_it_loads_on_each_backend(tmp_path: Path, backend: str) -> None:
    options = _options(backend)
    (tmp_path / INSIDE_NAME).write_bytes(b"\0" * 8 + WEIGHTS.tobytes())
    model = open_runtime(external_graph(tmp_path / "model.onnx", INSIDE_NAME, offset=8, length=16), options)
    x = np.array([10, 20, 30, 40], dtype=np.float32)
    np.testing.assert_allclose(model.run({"x": x}, ["y"])["y"], x + WEIGHTS)
