"""The playground's server side, over HTTP: `/` by Accept, `/stats`, the model card in /models, the
page's assets and the offline API docs (the page itself runs in test_playground_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from service.http.playground import STATIC
from service.http.schemas import StatsResponse
from support.helpers import REPO_ROOT

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

HTML = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


@pytest.fixture(scope="module")
def server(start_server: Any, carded_repository: Path) -> RunningServer:
    return start_server(model_repository=carded_repository, stats_interval_s=0.2)


def test_root_is_the_page_for_browsers_and_an_index_for_other_clients(server: RunningServer) -> None:
    with server.client() as client:
        page = client.get("/", headers=HTML)
        index = client.get("/")
        documented = client.get("/openapi.json").json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["vary"] == "Accept" == index.headers["vary"]
    body = index.json()
    assert body["playground"] is True and body["docs"] == "/docs"
    expected = {f"{m.upper()} {p}" for p, methods in documented["paths"].items() for m in methods}
    assert set(body["operations"]) == expected
    assert {"GET /stats", "POST /classify", "POST /fill-mask", "GET /models"} <= expected


def test_ui_off_answers_the_index_to_browsers_too(start_server: Any) -> None:
    server = start_server(ui=False)
    with server.client() as client:
        answer = client.get("/", headers=HTML)
    assert answer.status_code == 200 and answer.json()["playground"] is False


def test_every_asset_the_page_and_the_docs_name_is_served_from_here(server: RunningServer) -> None:
    with server.client() as client:
        pages = {path: client.get(path, headers=HTML).text for path in ("/", "/docs", "/redoc")}
        script = client.get("/ui/app.js").text
        for path, html in pages.items():
            urls = re.findall(r'(?:src|href)="([^"]+)"', html)
            assert urls, path
            for url in urls:
                assert "//" not in url, f"{path} loads {url} from elsewhere"
                absolute = url if url.startswith("/") else f"/{url}"
                assert client.get(absolute).status_code == 200, f"{path}: {url}"
        # The sample images the script offers, and the icon a browser asks for on its own.
        samples = re.search(r"const SAMPLES = \[([^\]]*)\]", script)
        assert samples is not None
        for name in json.loads(f"[{samples.group(1)}]"):
            image = client.get(f"/ui/samples/{name}.jpg")
            assert image.status_code == 200 and image.content[:2] == b"\xff\xd8"
        assert client.get("/favicon.ico").headers["content-type"] == "image/svg+xml"
        assert client.get("/ui/nothing-here.js").status_code == 404


def test_sample_images_are_the_load_tests_cifar_images() -> None:
    bundled = {p.read_bytes() for p in (REPO_ROOT / "loadtests" / "data").glob("cifar10-test-*.jpg")}
    samples = list((STATIC / "samples").glob("*.jpg"))
    assert samples and all(p.read_bytes() in bundled for p in samples)


def test_stats_counts_served_requests_only(server: RunningServer, cifar_images: list[bytes]) -> None:
    with server.client() as client:
        before = StatsResponse.model_validate(client.get("/stats").json())
        for path in ("/health/ready", "/stats", "/metrics", "/", "/ui/app.js", "/docs"):
            assert client.get(path).status_code == 200
        assert client.get("/stats").json()["requests_total"] == before.requests_total
        for image in cifar_images[:3]:
            assert client.post("/classify", files={"file": ("x.jpg", image)}).status_code == 200
        assert client.post("/fill-mask", json={"text": "no mask"}).status_code == 422
        after = StatsResponse.model_validate(client.get("/stats").json())
    assert after.ready and after.status == "ready"
    assert {m.name for m in after.models} == {"tiny-vision", "tiny-mlm"}
    assert after.requests_total == before.requests_total + 4
    assert after.window.requests >= 4 and after.window.requests_per_s > 0
    assert after.window.p50_ms is not None and after.window.p99_ms is not None
    assert 0 < after.window.p50_ms <= after.window.p99_ms
    assert after.window.batch_size is not None and after.window.batch_size >= 1
    assert after.batches_total >= before.batches_total + 3


def test_stats_series_covers_the_window_in_intervals(server: RunningServer) -> None:
    server.wait_for(lambda: len(server.client().get("/stats").json()["series"]) >= 3)
    with server.client() as client:
        body = StatsResponse.model_validate(client.get("/stats").json())
    times = [p.t for p in body.series]
    assert times == sorted(times) and body.interval_s == pytest.approx(0.2)
    assert body.window.seconds <= server.settings.stats_window_s + 2 * body.interval_s


def test_models_carry_the_model_card_summary(server: RunningServer, carded_repository: Path) -> None:
    with server.client() as client:
        models = {m["name"]: m for m in client.get("/models").json()["models"]}
    card = models["tiny-vision"]["card"]
    training = json.loads((REPO_ROOT / "checkpoints" / "cifar10-gmlp" / "training.json").read_text())
    variant = models["tiny-vision"]["variant"]
    served = training["served"][variant]["results"]["cifar10_test"]["top1"]
    assert card["accuracy"] == {"cifar10_test top1": served} and card["measured"] == variant
    assert card["title"] == "cifar10-gmlp" and "gMLP" in card["description"]
    assert models["tiny-mlm"]["card"] is None  # no README.md in its directory
