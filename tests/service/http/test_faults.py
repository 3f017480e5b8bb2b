"""Faults: ONNX Runtime failing inside a batch, corrupt or missing model files at start-up, SIGTERM
during a burst.

Every fault is real: ONNX Runtime really raises (a token id past the embedding table makes the
graph's Gather fail), the model files are really truncated, deleted or mismatched. What is checked is each
request's outcome and the message an operator sees, never a duration.

Chosen behaviours (docs/reliability.md):
- a request ONNX Runtime cannot run is a server fault: 500 `internal_error`, logged with the
  traceback. The request had passed every input check, so either a check is missing or the
  served model does not fit its own metadata; both are bugs to fix on the server side, not
  something a client can correct. Its batch-mates are retried one by one and succeed.
- a served-model directory that cannot be loaded fails the whole service with the reason, which
  names the file: `gmlp serve` refuses to start when a listed file is missing; a file that exists
  but does not load leaves the service up with /health/live and /health/ready at 503 and the
  reason in their body (never ready, so no traffic is routed to a replica serving a subset). A
  tokenizer with ids past the model's vocabulary is such a file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.spec import read_spec
from gmlp.server_process import gmlp_serve
from loadtests.checks import check_classify, check_fill_mask
from loadtests.runner import http_get
from service import cli
from service.app import create_app
from service.engine.request_context import Deadline
from service.engine.rows import Job
from service.http.routing import public
from service.settings import ServiceSettings
from service.tasks.fill_mask import FillMaskPipeline
from service.tasks.registry import load_pipeline
from service.telemetry.metrics import ServiceMetrics

if TYPE_CHECKING:  # at run time the harness is loaded by pytest as a plugin (assertion rewriting)
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

GOOD_TEXTS = ["the [MASK] sat on the mat.", "paris is the [MASK] of france.", "she [MASK] the ball."]
POISON_WORD = "zebra"


def _fill_mask_pipeline(spec_dir: Path, settings: ServiceSettings) -> FillMaskPipeline:
    spec = read_spec(spec_dir)
    assert spec is not None
    pipeline = load_pipeline(spec, settings, "cpu", ServiceMetrics(settings.max_batch_size), "1")
    assert isinstance(pipeline, FillMaskPipeline)
    return pipeline


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_ort_failure_in_a_batch_fails_only_the_poisoned_request(
    tiny_mlm_served: Path,
    make_settings: Callable[..., ServiceSettings],
    caplog: pytest.LogCaptureFixture,
    variant: str,
) -> None:
    """One feed with an id >= vocab_size, batched with good ones: ORT's Gather raises for the batch;
    the batcher retries one by one, the good ones get exactly their results run alone."""
    # One instance: the four submitted together form one batch (two would share them out).
    settings = make_settings(variant=variant, max_batch_size=8, max_queue_delay_ms=0.0, instances=1)
    pipeline = _fill_mask_pipeline(tiny_mlm_served, settings)
    codec = pipeline.codec
    good = [codec.encode(text).feeds for text in GOOD_TEXTS]
    poisoned = {
        "input_ids": np.array([good[0]["input_ids"][0], codec.vocab_size + 7, codec.mask_id], np.int64),
        "mask_positions": np.array([2], np.int64),
    }

    async def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return (await pipeline.queued(Job(feeds), Deadline.after(30))).outputs

    async def main() -> tuple[list[Any], list[Any]]:
        pipeline.batcher.start()
        try:
            alone = [await infer(feeds) for feeds in good]
            # Submitted in one go, before the batching loop runs: they form one batch.
            together = await asyncio.gather(
                *(infer(f) for f in [good[0], poisoned, *good[1:]]),
                return_exceptions=True,
            )
            return alone, together
        finally:
            await pipeline.batcher.close(10)

    with caplog.at_level(logging.WARNING, logger="service.engine.batcher"):
        alone, together = asyncio.run(asyncio.wait_for(main(), 60))

    assert any("batch of 4 failed" in r.getMessage() for r in caplog.records), caplog.text
    error = together[1]
    assert isinstance(error, Exception), error
    assert "Gather" in str(error) and "out of data bounds" in str(error), repr(error)  # ORT's own
    for expected, got in zip(alone, [together[0], *together[2:]], strict=True):
        assert isinstance(got, dict), got
        assert np.array_equal(expected["logits"], got["logits"])


def _copy_model(source: Path, repository: Path) -> Path:
    target = repository / source.name
    shutil.copytree(source, target)
    return target


def test_an_unexpected_error_is_a_500_logged_once_with_method_and_path(
    start_server: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a route: the client gets 500 `internal_error` and nothing internal, the log gets
    exactly one traceback, naming the request (not a second one from the server without it)."""

    @public
    async def broken() -> None:
        raise RuntimeError("a bug in a route")

    server = start_server(prepare=lambda app: app.add_api_route("/broken", broken, methods=["POST"]))
    # uvicorn's loggers do not propagate to the root; its logging set-up (uvicorn.Config) is done.
    server_log = logging.getLogger("uvicorn")
    server_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING), server.client() as client:
            response = client.post("/broken")
            # The same connection serves on (uvicorn drops it after an exception that reaches it).
            assert client.get("/health/ready").status_code == 200
        refused = server.metric("gmlp_refusals_total", transport="rest", code="internal_error")
        server.stop()  # every request task has finished, and logged, once it returns
    finally:
        server_log.removeHandler(caplog.handler)
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"
    assert "a bug" not in response.text and refused == 1
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert [r.getMessage() for r in tracebacks] == ["unhandled error on POST /broken"], caplog.text
    assert "a bug in a route" in caplog.text


@pytest.fixture
def broken_repository(repository: Path, tmp_path: Path) -> Path:
    """A copy of the test repository (tiny classifier + tiny MLM) for a test to break."""
    copy = tmp_path / "repository"
    for model in (repository / "tiny-vision", repository / "tiny-mlm"):
        _copy_model(model, copy)
    return copy


def _load_failed(settings: ServiceSettings) -> dict[str, httpx.Response]:
    """What a client sees after the service tried to load `settings`' repository."""

    async def main() -> dict[str, httpx.Response]:
        app = create_app(settings)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            await app.state.service.load()
            try:
                return {
                    "live": await client.get("/health/live"),
                    "ready": await client.get("/health/ready"),
                    "fill": await client.post("/fill-mask", json={"text": "a [MASK] day"}),
                    "classify": await client.post(
                        "/classify", content=b"x", headers={"content-type": "image/jpeg"}
                    ),
                }
            finally:
                await app.state.service.shutdown()

    return asyncio.run(asyncio.wait_for(main(), 60))


def _assert_failed_naming(responses: dict[str, httpx.Response], fragment: str) -> None:
    live, ready = responses["live"], responses["ready"]
    assert live.status_code == ready.status_code == 503
    assert live.json()["status"] == ready.json()["status"] == "failed"
    assert fragment in live.json()["detail"] and fragment in ready.json()["detail"], ready.text
    for task in ("fill", "classify"):  # the intact model is not served either
        refused = responses[task]
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        assert fragment in refused.json()["error"]["message"]
        assert "retry-after" not in refused.headers  # retrying will not help


def test_truncated_model_file_fails_loading_with_the_file_named(
    broken_repository: Path, make_settings: Callable[..., ServiceSettings]
) -> None:
    model_file = broken_repository / "tiny-mlm" / "model.int8.onnx"
    data = model_file.read_bytes()
    model_file.write_bytes(data[: len(data) // 2])
    responses = _load_failed(make_settings(model_repository=broken_repository, variant="int8"))
    _assert_failed_naming(responses, str(model_file))


def test_missing_variant_file_fails_loading_and_serve_start_up(
    broken_repository: Path,
    make_settings: Callable[..., ServiceSettings],
    capsys: pytest.CaptureFixture[str],
) -> None:
    (broken_repository / "tiny-mlm" / "model.int8.onnx").unlink()
    config = broken_repository / "tiny-mlm" / "config.json"
    # The app (uvicorn --factory) comes up, never ready, with the reason in its health body.
    responses = _load_failed(make_settings(model_repository=broken_repository))
    _assert_failed_naming(responses, "model.int8.onnx")
    assert str(config) in responses["ready"].json()["detail"]
    # `gmlp serve` checks the repository before it listens: exit status 1 and the reason.
    status = cli.main(["--model-repository", str(broken_repository), "--checkpoint-dir", "", "--port", "9"])
    err = capsys.readouterr().err
    assert status == 1 and "model.int8.onnx" in err and str(config) in err, err


def test_tokenizer_past_the_model_vocabulary_fails_loading_with_both_sizes(
    broken_repository: Path, make_settings: Callable[..., ServiceSettings]
) -> None:
    """A tokenizer that maps a word past the graph's vocabulary would fail in ONNX Runtime only for
    texts with that word; the model is refused when it loads instead, like a corrupt file."""
    model = broken_repository / "tiny-mlm"
    tokenizer_file = model / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text())
    vocab_size = json.loads((model / "config.json").read_text())["model"]["vocab_size"]
    tokenizer["model"]["vocab"][POISON_WORD] = vocab_size + 100
    tokenizer_file.write_text(json.dumps(tokenizer))
    responses = _load_failed(make_settings(model_repository=broken_repository))
    _assert_failed_naming(responses, str(tokenizer_file))
    detail = responses["ready"].json()["detail"]
    assert f"{vocab_size + 101} ids" in detail and f"vocabulary of {vocab_size}" in detail, detail


def _queued(url: str) -> float:
    """Requests waiting in all batch queues of the server at `url` (its /metrics)."""
    text = http_get(f"{url}/metrics").decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gmlp_queue_depth"
    )


def _refuses_connections(url: str) -> bool:
    try:
        httpx.get(f"{url}/health/live", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def test_sigterm_during_a_burst_answers_every_accepted_request(
    repository: Path, cifar_images: list[bytes], tmp_path: Path, poll: Callable[..., None]
) -> None:
    """A real `gmlp serve` process: a burst of requests is queued (a long batching window holds
    them), SIGTERM arrives; the server stops accepting connections, answers every queued request
    with its result, drains the batchers and exits."""
    server = gmlp_serve(
        repository,
        log_path=tmp_path / "server.log",
        serve_args=["--intra-op-threads", "1", "--max-batch-size", "64"]
        + ["--max-queue-delay-ms", "8000", "--queue-delay-policy", "always"],
        ready_timeout_s=90,
    )
    images, texts = cifar_images[:8], [*GOOD_TEXTS, *GOOD_TEXTS, *GOOD_TEXTS[:2]]

    def classify(image: bytes) -> httpx.Response:  # each request on a connection of its own
        return httpx.post(
            f"{server.url}/classify?top_k=3",
            content=image,
            headers={"content-type": "image/jpeg"},
            timeout=60,
        )

    def fill_mask(text: str) -> httpx.Response:
        return httpx.post(f"{server.url}/fill-mask", json={"text": text, "top_k": 3}, timeout=60)

    with server, ThreadPoolExecutor(len(images) + len(texts)) as pool:
        burst = [pool.submit(classify, image) for image in images]
        burst += [pool.submit(fill_mask, text) for text in texts]
        poll(lambda: _queued(server.url) == len(burst), timeout=30, interval=0.1)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        poll(lambda: _refuses_connections(server.url), timeout=30, interval=0.1)
        answers = [future.result(timeout=90) for future in burst]
        exit_status = server.proc.wait(timeout=90)

    assert [a.status_code for a in answers] == [200] * len(burst), [
        a.text for a in answers if a.status_code != 200
    ]
    for answer in answers[: len(images)]:
        assert check_classify(answer.json(), 3) is None
    for answer, text in zip(answers[len(images) :], texts, strict=True):
        assert check_fill_mask(answer.json(), text, 3) is None
    # uvicorn re-raises the signal once it has shut down, so the process ends "killed by SIGTERM"
    # (143 in a shell) after a complete, graceful shutdown.
    assert exit_status in (0, -signal.SIGTERM), server.log_tail()
    log = server.log_tail()
    assert "drained and closed 2 models" in log and "Application shutdown complete" in log, log
