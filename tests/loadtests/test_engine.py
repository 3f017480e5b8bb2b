"""The load engine against a real `gmlp serve`: good answers are timed, refused and wrong ones are
failures by reason, the count, time and stop bounds hold, in closed and in open loop; and the one
percentile function."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from contract.formats import MLM_TASK, VISION_TASK
from gmlp.server_process import ServerProcess, gmlp_serve
from loadtests.engine import PreparedRequest, open_loop, percentile, run_closed_loop, task_requests


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


def test_a_stop_condition_ends_the_closed_loop(server: ServerProcess) -> None:
    requests = task_requests(VISION_TASK, "tiny-vision", None)
    sent: list[int] = []

    def stop() -> bool:  # holds once 5 requests have been let through
        sent.append(1)
        return len(sent) > 5

    result = run_closed_loop(server.base_url, requests, concurrency=1, seconds=60.0, stop=stop)
    assert result.answered == result.ok == 5


def test_open_loop_sends_every_arrival_and_times_it(server: ServerProcess) -> None:
    requests = task_requests(VISION_TASK, "tiny-vision", None)
    result = asyncio.run(open_loop(server.base_url, requests, rate=20.0, seconds=1.0, late_s=60.0))
    assert result.failed == 0, result.failures
    # 20 arrivals, none dropped (late_s is wide, the bound of open requests far off)
    assert result.ok == result.answered == 20 and result.late == result.skipped == 0
    starts = sorted(o.started for o in result.outcomes)
    assert starts[-1] - starts[0] >= 19 / 20 - 0.01  # spread over the second, not sent at once
    assert {o.path for o in result.outcomes} == {"/classify"} and result.drain_s >= 0


def test_open_loop_counts_arrivals_past_its_bound(server: ServerProcess) -> None:
    requests = task_requests(VISION_TASK, "tiny-vision", None)
    result = asyncio.run(
        open_loop(server.base_url, requests, rate=200.0, seconds=0.2, max_outstanding=0, late_s=60.0)
    )
    assert result.outcomes == [] and result.skipped == 40


class _EchoHeaders(BaseHTTPRequestHandler):
    """Answers every POST with the request's headers as JSON."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps(dict(self.headers.items())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_headers_and_body_are_sent_as_given() -> None:
    echo = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHeaders)
    thread = threading.Thread(target=echo.serve_forever, daemon=True)
    thread.start()
    try:

        def check(answer: dict[str, str]) -> str | None:
            ok = answer.get("Authorization") == "Bearer k" and answer.get("Content-Type") == "text/x"
            return None if ok else f"headers {answer}"

        request = PreparedRequest("/echo", b"12345", "text/x", check, (("Authorization", "Bearer k"),))
        url = f"http://127.0.0.1:{echo.server_address[1]}"
        result = run_closed_loop(url, [request], concurrency=2, seconds=60.0, max_requests=6)
    finally:
        echo.shutdown()
        echo.server_close()
    assert result.ok == result.answered == 6, result.failures


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert (
        percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    )
    assert percentile([7.0, 3.0], 50) == 3.0 and percentile([7.0, 3.0], 51) == 7.0
    assert percentile([], 50) is None
