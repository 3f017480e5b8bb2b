"""The closed-loop client against a real `gmlp serve`: good answers are timed, refused and wrong
ones are failures by reason, and the count and time bounds hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.formats import MLM_TASK, VISION_TASK
from gmlp.server_process import ServerProcess, gmlp_serve
from loadtests.closed_loop import PreparedRequest, run_closed_loop, task_requests


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Iterator[ServerProcess]:
    with gmlp_serve(model_repository, log_path=tmp_path_factory.mktemp("loop") / "server.log") as running:
        yield running


def test_good_answers_are_timed(server: ServerProcess) -> None:
    for task, model, n in ((VISION_TASK, "tiny-vision", None), (MLM_TASK, "tiny-mlm", 16)):
        result = run_closed_loop(server.base_url, task_requests(task, model, n), concurrency=2, seconds=0.5)
        assert result.failed == 0, result.failures
        assert result.ok == len(result.latencies_ms) > 0 and result.answered >= result.ok
        p50, p99 = result.percentile_ms(50), result.percentile_ms(99)
        assert p50 is not None and p99 is not None and 0 < p50 <= p99 <= max(result.latencies_ms)


def test_refused_and_wrong_answers_are_failures(server: ServerProcess) -> None:
    good = task_requests(VISION_TASK, "tiny-vision", None)[0]
    missing = PreparedRequest("/classify?model=nope", good.body, good.content_type, good.check)
    # A 200 that the check refuses (it expects another model's name) is a failure too.
    wrong = task_requests(VISION_TASK, "another-model", None)[0]
    wrong = PreparedRequest(good.path, good.body, good.content_type, wrong.check)
    result = run_closed_loop(server.base_url, [missing, wrong], concurrency=2, seconds=60.0, max_requests=20)
    assert result.ok == 0 and result.failed == result.answered == 20  # the count bounds the window
    assert result.failures["HTTP 404 model_not_found"] == 10
    assert sum(n for reason, n in result.failures.items() if "another-model" in reason) == 10
