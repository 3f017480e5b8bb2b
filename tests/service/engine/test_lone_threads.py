"""Adaptive threading on real ORT sessions: a one-row batch that starts while no other run goes
takes the lone session (all its threads); overlapping batches, and batches of several rows, take
the instances' session.

Each session of a tiny exported model is wrapped in a spy that records which one ran and can hold
its run behind a gate, so that "another run is going" is a state reached deterministically, not
by timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.spec import read_spec
from service.engine.batcher import DynamicBatcher
from service.engine.runtime import Feeds, OnnxModel, RuntimeOptions
from service.tasks.vision import VisionPipeline
from service.telemetry.metrics import ServiceMetrics

pytestmark = pytest.mark.timeout(120)


class Spy:
    """An ORT session that logs its label on each run and waits for `gate` (when set) to finish it,
    or `delay` seconds before running."""

    def __init__(self, session: Any, label: str, log: list[str]) -> None:
        self.session, self.label, self.log = session, label, log
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.delay = 0.0

    def __getattr__(self, name: str) -> Any:  # the rest of the session (its inputs, outputs)
        return getattr(self.session, name)

    def run(self, names: list[str], feeds: Feeds, options: Any = None) -> list[np.ndarray]:
        self.log.append(self.label)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(20), "gate never opened"
        time.sleep(self.delay)
        return self.session.run(names, feeds, options)


def spied(path: Path, **options: Any) -> tuple[OnnxModel, list[str]]:
    model = OnnxModel(path, RuntimeOptions(**options))
    log: list[str] = []
    model.session = Spy(model.session, "instance", log)
    if model.lone_session is not None:
        model.lone_session = Spy(model.lone_session, "lone", log)
    return model, log


def row(model: OnnxModel) -> Feeds:
    (name,) = model.input_names
    shape = [d or 1 for d in model.static_dims(name)[1:]]
    return {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def test_a_lone_batch_runs_wide_and_overlapping_ones_on_the_instance_threads(
    tiny_vision_served: Path,
) -> None:
    model, log = spied(tiny_vision_served / "model.onnx", intra_op_threads=1, lone_threads=2)
    lone = model.lone_session
    assert isinstance(lone, Spy)
    lone.gate = threading.Event()
    batcher: DynamicBatcher[Feeds, Feeds] = DynamicBatcher(
        lambda items: model.run_batch(items),
        max_batch_size=4,
        max_queue_delay_s=0.0,
        max_queue_size=10,
        instances=2,
    )
    expected = model.session.session.run(None, {k: v[None] for k, v in row(model).items()})[0][0]

    async def scenario() -> list[Any]:
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(row(model)))
        await asyncio.to_thread(lone.entered.wait, 20)  # the lone run is going, held by its gate
        second = await batcher.submit(row(model))  # the other instance's batch, while it goes
        assert log == ["lone", "instance"]
        lone.gate.set()
        lone.gate = None
        answers = [second, await first, await batcher.submit(row(model))]  # the last alone again
        await batcher.close()
        return answers

    answers = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert log == ["lone", "instance", "lone"]
    for answer in answers:
        np.testing.assert_allclose(answer.output["logits"], expected, rtol=0, atol=1e-5)


def test_a_run_of_another_model_makes_a_run_overlapping(tiny_vision_served: Path) -> None:
    """Whether a run is alone counts every model's runs: two models share the CPUs."""
    first, first_log = spied(tiny_vision_served / "model.onnx", intra_op_threads=1, lone_threads=2)
    other, other_log = spied(tiny_vision_served / "model.int8.onnx", intra_op_threads=1, lone_threads=2)
    assert isinstance(first.lone_session, Spy)
    first.lone_session.gate = gate = threading.Event()
    held = threading.Thread(target=first.run, args=({k: v[None] for k, v in row(first).items()},))
    held.start()
    assert first.lone_session.entered.wait(20)
    other.run({k: v[None] for k, v in row(other).items()})
    gate.set()
    held.join(20)
    assert (first_log, other_log) == (["lone"], ["instance"])


def test_a_lone_batch_of_several_rows_runs_on_the_instance_threads(tiny_vision_served: Path) -> None:
    model, log = spied(tiny_vision_served / "model.onnx", intra_op_threads=1, lone_threads=2)
    model.run_batch([row(model)] * 2)
    model.run_batch([row(model)])
    assert log == ["instance", "lone"]


@pytest.mark.parametrize("lone_threads", [0, 1])
def test_no_lone_session_unless_it_has_more_threads(tiny_vision_served: Path, lone_threads: int) -> None:
    model, log = spied(tiny_vision_served / "model.onnx", intra_op_threads=1, lone_threads=lone_threads)
    assert model.lone_session is None
    model.run({k: v[None] for k, v in row(model).items()})
    assert log == ["instance"]


def test_the_warm_up_runs_every_session(tiny_vision_served: Path) -> None:
    """Each session allocates its arenas at start-up, not on a client's request."""
    model, log = spied(tiny_vision_served / "model.onnx", intra_op_threads=1, lone_threads=2)
    with model.on_every_session():
        model.run_batch([row(model)] * 3)
    assert sorted(log) == ["instance", "lone"]
    model.run({k: v[None] for k, v in row(model).items()})
    assert log[-1] == "lone"


def test_the_warm_up_gives_the_lone_session_one_row_only(tiny_vision_served: Path, make_settings) -> None:
    """A lone session only ever runs one row: the warm-up's full batch goes to the instances'
    session alone, so that the lone session's arena does not keep a batch's memory for nothing."""
    settings = make_settings(lone_threads=2, intra_op_threads=1, max_batch_size=4, variant="fp32")
    spec = read_spec(tiny_vision_served)
    assert spec is not None
    model = VisionPipeline.open(spec, settings, "cpu", ServiceMetrics(4), "1")
    rows: list[tuple[str, int]] = []
    for label in ("session", "lone_session"):
        real = getattr(model.session, label)
        spy = Spy(real, label, [])
        spy.run = lambda names, feeds, options=None, real=real, label=label: (  # type: ignore[method-assign]
            rows.append((label, len(next(iter(feeds.values()))))) or real.run(names, feeds, options)
        )
        setattr(model.session, label, spy)
    model.warm_up()
    assert ("session", 4) in rows and ("lone_session", 1) in rows
    assert {n for label, n in rows if label == "lone_session"} == {1}
