"""The warm-up's memory goes back: runs inside `Runtime.warming` shrink ONNX Runtime's arena as
they end and the C heap is trimmed after, where the arena would keep their peak for good."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from service.engine.runtime import OnnxModel, RuntimeOptions, give_back_freed_memory

ROWS = 2048  # a batch of the tiny classifier whose run takes over 100 MiB


def kept_after_a_batch(path: Path, warming: bool, alive: list[OnnxModel]) -> int:
    """Bytes this process holds after one batch of `ROWS` more than before it (the runtime kept
    in `alive`, so that its memory is not given back by its end)."""
    runtime = OnnxModel(path, RuntimeOptions(intra_op_threads=1), name="tiny")
    alive.append(runtime)
    give_back_freed_memory()
    (entry,) = runtime.session.get_inputs()
    feeds = {entry.name: np.ones([ROWS, *entry.shape[1:]], np.float32)}
    process = psutil.Process()
    before = process.memory_full_info().uss
    if warming:
        with runtime.warming():
            runtime.run(feeds)
    else:
        runtime.run(feeds)
    return int(process.memory_full_info().uss - before)


@pytest.mark.parametrize("variant", ["model.onnx", "model.int8.onnx"])
def test_a_warming_run_gives_its_memory_back(tiny_vision_served: Path, variant: str) -> None:
    alive: list[OnnxModel] = []
    kept = kept_after_a_batch(tiny_vision_served / variant, False, alive)
    given_back = kept_after_a_batch(tiny_vision_served / variant, True, alive)
    assert kept > 64 * 2**20  # the arena keeps the batch's peak
    assert given_back < kept / 4
