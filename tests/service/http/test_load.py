"""Batching under concurrent load, shedding, deadlines, disconnects, readiness and graceful shutdown.

Queue states are made observable with a long batching window that every request waits for
(`max_queue_delay_ms` with `queue_delay_policy="always"`): requests wait in the queue for it, and
the tests poll the queue-depth metric (bounded) before acting. Nothing asserts wall-clock
durations.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from service.app import create_app
from service.settings import ServiceSettings

if TYPE_CHECKING:  # at run time the harness is loaded by pytest as a plugin (assertion rewriting)
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

WINDOW_MS = 3000.0  # long enough to observe a queued request, short enough to keep the suite fast
TEXTS = [
    "the [MASK] sat on the mat.",
    "paris is the [MASK] of france.",
    "i went to the [MASK] to buy [MASK].",
    "she [MASK] the ball.",
]


def classify(server: RunningServer, image: bytes, **params: Any) -> httpx.Response:
    with server.client() as client:
        return client.post(
            "/classify", params={"top_k": 10, **params}, content=image, headers={"content-type": "image/jpeg"}
        )


def fill_mask(server: RunningServer, text: str) -> httpx.Response:
    with server.client() as client:
        return client.post("/fill-mask", json={"text": text, "top_k": 5})


def batches(server: RunningServer, model: str) -> tuple[float, float]:
    """(number of batches run, requests in them) for `model`."""
    return server.metric("gmlp_batch_size_count", model=model), server.metric(
        "gmlp_batch_size_sum", model=model
    )


def scores(response: httpx.Response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    return {p["label"]: p["score"] for p in response.json()["predictions"]}


def mask_scores(response: httpx.Response) -> list[list[tuple[int, float]]]:
    assert response.status_code == 200, response.text
    return [[(p["token"], p["score"]) for p in preds] for preds in response.json()["predictions"]]


def run_together(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Start all calls at the same moment (barrier) from separate threads; results in order."""
    barrier = threading.Barrier(len(calls))

    def go(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls, timeout=90))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_concurrent_requests_are_batched_and_equal_unbatched_results(
    start_server: Any, cifar_images: list[bytes], variant: str
) -> None:
    server = start_server(
        variant=variant, max_batch_size=8, max_queue_delay_ms=250.0, queue_delay_policy="always"
    )
    images = cifar_images[:8]
    alone = [scores(classify(server, image)) for image in images]  # one at a time: batches of 1
    alone_mlm = [mask_scores(fill_mask(server, text)) for text in TEXTS]
    before, before_mlm = batches(server, "tiny-vision"), batches(server, "tiny-mlm")
    assert before[0] == before[1] == len(images)

    calls = [lambda im=im: classify(server, im) for im in images] + [
        lambda t=t: fill_mask(server, t) for t in TEXTS
    ]
    responses = run_together(calls)
    together, together_mlm = (
        [scores(r) for r in responses[: len(images)]],
        [mask_scores(r) for r in responses[len(images) :]],
    )

    after, after_mlm = batches(server, "tiny-vision"), batches(server, "tiny-mlm")
    assert after[1] - before[1] == len(images) and after_mlm[1] - before_mlm[1] == len(TEXTS)
    assert after[0] - before[0] < len(images), "no batch of more than one request formed"
    # A request's result does not depend on its batch-mates (int8 rows run one at a time: exact).
    tolerance = 0.0 if variant == "int8" else 1e-6
    for a, t in zip(alone, together, strict=True):
        assert a.keys() == t.keys()
        assert max(abs(a[k] - t[k]) for k in a) <= tolerance
    for a, t in zip(alone_mlm, together_mlm, strict=True):
        assert [[tok for tok, _ in m] for m in a] == [[tok for tok, _ in m] for m in t]
        assert np.allclose(
            [[s for _, s in m] for m in a], [[s for _, s in m] for m in t], rtol=0, atol=tolerance
        )


@pytest.fixture(scope="module")
def slow_server(start_server: Any) -> RunningServer:
    """Requests wait WINDOW_MS for batch-mates; at most 2 may wait."""
    return start_server(
        max_batch_size=64, max_queue_delay_ms=WINDOW_MS, max_queue_size=2, queue_delay_policy="always"
    )


def test_full_queue_is_refused_with_503_and_retry_after(
    slow_server: RunningServer, cifar_images: list[bytes]
) -> None:
    rejected_before = slow_server.metric("gmlp_rejections_total", model="tiny-vision", reason="queue_full")
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(classify, slow_server, cifar_images[i]) for i in range(2)]
        slow_server.wait_for(
            lambda: slow_server.metric("gmlp_queue_depth", model="tiny-vision", version="1") == 2
        )
        refused = classify(slow_server, cifar_images[2])
        results = [f.result(timeout=60) for f in waiting]
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded" and "queue" in refused.json()["error"]["message"]
    assert [r.status_code for r in results] == [200, 200]
    assert (
        slow_server.metric("gmlp_rejections_total", model="tiny-vision", reason="queue_full")
        == rejected_before + 1
    )


def _request_bytes(image: bytes) -> bytes:
    head = (
        "POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: image/jpeg\r\n"
        f"Content-Length: {len(image)}\r\n\r\n"
    )
    return head.encode() + image


def test_disconnected_client_is_dropped_before_its_request_runs(
    slow_server: RunningServer, cifar_images: list[bytes]
) -> None:
    count, size = batches(slow_server, "tiny-vision")
    cancelled = slow_server.metric("gmlp_rejections_total", model="tiny-vision", reason="cancelled")
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=10) as sock:
        sock.sendall(_request_bytes(cifar_images[3]))
        slow_server.wait_for(
            lambda: slow_server.metric("gmlp_queue_depth", model="tiny-vision", version="1") == 1
        )
    # The client is gone: the server notices, withdraws the request and records a 499.
    slow_server.wait_for(
        lambda: (
            slow_server.metric("gmlp_rejections_total", model="tiny-vision", reason="cancelled")
            == cancelled + 1
        )
    )
    assert slow_server.metric("gmlp_queue_depth", model="tiny-vision", version="1") == 0
    assert classify(slow_server, cifar_images[4]).status_code == 200
    # Exactly one more batch, holding only the request that stayed.
    assert batches(slow_server, "tiny-vision") == (count + 1, size + 1)
    assert slow_server.metric("gmlp_http_requests_total", method="POST", route="/classify", status="499") >= 1


def test_request_past_its_deadline_gets_504(start_server: Any, cifar_images: list[bytes]) -> None:
    server = start_server(
        max_batch_size=64, max_queue_delay_ms=60_000.0, request_timeout_s=0.5, queue_delay_policy="always"
    )
    response = classify(server, cifar_images[5])
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    assert server.metric("gmlp_rejections_total", model="tiny-vision", reason="deadline") == 1
    assert server.metric("gmlp_batch_size_count", model="tiny-vision") == 0  # it never ran
    with server.client() as client:
        late = client.post("/fill-mask", json={"text": "a [MASK] day"})
    assert late.status_code == 504


def test_graceful_shutdown_finishes_queued_requests(start_server: Any, cifar_images: list[bytes]) -> None:
    server = start_server(max_batch_size=64, max_queue_delay_ms=2000.0, queue_delay_policy="always")
    with ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(classify, server, cifar_images[i]) for i in range(2)]
        pending.append(pool.submit(fill_mask, server, TEXTS[0]))

        def queued() -> float:
            return sum(
                server.metric("gmlp_queue_depth", model=m, version="1") for m in ("tiny-vision", "tiny-mlm")
            )

        server.wait_for(lambda: queued() == 3)
        server.stop()  # like SIGTERM: stop accepting, finish in-flight requests, drain, exit
        results = [f.result(timeout=60) for f in pending]
    assert [r.status_code for r in results] == [200, 200, 200]
    state = server.app.state.service
    assert state.phase == "draining" and all(len(m.batcher.queue) == 0 for m in state.newest_ready().values())
    with pytest.raises(httpx.ConnectError):
        classify(server, cifar_images[0])


def test_readiness_before_and_after_loading(make_settings: Callable[..., ServiceSettings]) -> None:
    """Before the models are loaded and warmed up: live 200, ready 503, tasks 503; then all 200."""

    async def main() -> None:
        app = create_app(make_settings())
        state = app.state.service
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            assert (await client.get("/health/live")).status_code == 200
            ready = await client.get("/health/ready")
            assert ready.status_code == 503 and ready.json()["status"] == "loading"
            assert (await client.get("/v2/health/ready")).status_code == 400
            early = await client.post("/fill-mask", json={"text": "[MASK]"})
            assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
            assert early.headers["retry-after"] == "1"
            assert (await client.get("/models")).json()["models"] == []

            await state.load()  # what the lifespan runs in the background: load + warm-up

            assert (await client.get("/health/ready")).json() == {"status": "ready"}
            assert all(m.ready for m in state.newest_ready().values()) and len(state.newest_ready()) == 2
            assert (await client.post("/fill-mask", json={"text": "[MASK]"})).status_code == 200
            await state.shutdown()
            draining = await client.get("/health/ready")
            assert draining.status_code == 503 and draining.json()["status"] == "draining"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_failed_loading_is_visible_in_health(
    make_settings: Callable[..., ServiceSettings], tmp_path: Path
) -> None:
    async def main() -> None:
        app = create_app(make_settings(model_repository=tmp_path))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            await app.state.service.load()
            live, ready = await client.get("/health/live"), await client.get("/health/ready")
            assert live.status_code == ready.status_code == 503
            assert "no served models" in ready.json()["detail"] and live.json()["status"] == "failed"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_default_model_of_the_wrong_task_fails_loading(
    make_settings: Callable[..., ServiceSettings],
) -> None:
    async def main() -> None:
        state = create_app(make_settings(default_fill_mask="tiny-vision")).state.service
        await state.load()
        assert state.phase == "failed" and "not a served fill-mask model" in (state.error or "")
        await state.shutdown()
        chosen = create_app(make_settings(default_classifier="tiny-vision")).state.service
        await chosen.load()
        assert chosen.defaults == {"image-classification": "tiny-vision", "fill-mask": "tiny-mlm"}
        await chosen.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))
