"""The playground in a real browser: Debian's Chromium, headless, driven by Playwright, against a
real server with the tiny models.

Every page runs in a context that lets requests reach the test server only (anything else is
aborted and fails the test) and records every request and console message: a test fails on any
console error or warning it did not expect. The accessibility check is axe-core (vendored under
vendor/axe-core, so nothing is fetched). Screenshots at desktop and phone widths are written to
`$GMLP_TEST_ARTIFACTS/playground/` (CI keeps that folder), else to the pytest temp folder.

Skipped, saying why, only where Chromium is not installed (`apt-get install chromium`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Route, expect, sync_playwright

from support.helpers import REPO_ROOT

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
CAT_JPEG = REPO_ROOT / "loadtests" / "data" / "cifar10-test-03000-cat.jpg"
UPLOAD_LIMIT = 64 * 1024
DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}
# What the page may call besides its own files (GET / and /ui/...): the API it documents.
PAGE_API = {("GET", "/models"), ("GET", "/stats"), ("POST", "/classify"), ("POST", "/fill-mask")}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium is not installed ({CHROMIUM}): apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(start_server: Any, carded_repository: Path) -> RunningServer:
    return start_server(
        model_repository=carded_repository, max_upload_bytes=UPLOAD_LIMIT, stats_interval_s=0.5
    )


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("GMLP_TEST_ARTIFACTS")
    folder = Path(root) / "playground" if root else tmp_path_factory.mktemp("artifacts") / "playground"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Visit:
    """A page in its own browser context, with what it asked for and what it logged."""

    page: Page
    requests: list[Request] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)
    console: list[ConsoleMessage | _PageError] = field(default_factory=list)
    # Console errors the test provokes on purpose (Chromium logs a refused request as one).
    expected: list[str] = field(default_factory=list)
    # Console levels that fail the test (the vendored ReDoc warns about its own example generator).
    failing: tuple[str, ...] = ("error", "warning")

    def own_files(self) -> list[Request]:
        """The page, its assets and its icon (which a browser may ask for at the root)."""
        return [r for r in self.requests if _is_own_file(urlsplit(r.url).path)]

    def api_calls(self) -> list[tuple[str, str]]:
        return [
            (r.method, urlsplit(r.url).path) for r in self.requests if not _is_own_file(urlsplit(r.url).path)
        ]

    def unexpected_console(self) -> list[str]:
        return [
            f"{m.type}: {m.text}"
            for m in self.console
            if m.type in self.failing and not any(e in m.text for e in self.expected)
        ]


@pytest.fixture
def visit(browser: Browser, server: RunningServer) -> Iterator[Callable[..., Visit]]:
    """Open a path of the server in a fresh context; on teardown, fail on requests that left the
    server and on unexpected console errors or uncaught exceptions."""
    contexts, visits = [], []

    def open_page(path: str = "/", viewport: dict[str, int] = DESKTOP, **options: Any) -> Visit:
        context = browser.new_context(viewport=viewport, **options)
        contexts.append(context)
        page = context.new_page()
        seen = Visit(page)
        visits.append(seen)

        def route(route: Route) -> None:
            if route.request.url.startswith(server.url + "/"):
                route.continue_()
            else:
                seen.elsewhere.append(route.request.url)
                route.abort()

        context.route("**/*", route)
        page.on("request", lambda request: seen.requests.append(request))
        page.on("console", lambda message: seen.console.append(message))
        page.on("pageerror", lambda error: seen.console.append(_PageError(str(error))))
        page.goto(server.url + path)
        return seen

    yield open_page
    for seen in visits:
        seen.page.wait_for_load_state("networkidle")
    for context in contexts:
        context.close()
    for seen in visits:
        assert not seen.elsewhere, f"requests left the server: {seen.elsewhere}"
        assert not seen.unexpected_console(), seen.unexpected_console()


def _is_own_file(path: str) -> bool:
    return path in ("/", "/favicon.ico") or path.startswith("/ui/")


@dataclass
class _PageError:
    """An uncaught exception, recorded with the console messages."""

    text: str
    type: str = "error"


def _classifier(page: Page) -> Any:
    return page.locator(".panel", has_text="tiny-vision")


def _fill_mask(page: Page) -> Any:
    return page.locator(".panel", has_text="tiny-mlm")


def _percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_classify_the_cat_jpeg(visit: Callable[..., Visit], server: RunningServer) -> None:
    seen = visit()
    panel = _classifier(seen.page)
    panel.locator("input[type=file]").set_input_files(CAT_JPEG)
    first = panel.locator(".bars li").first
    expect(first).to_be_visible()
    with server.client() as client:
        answer = client.post(
            "/classify", params={"model": "tiny-vision"}, files={"file": CAT_JPEG.read_bytes()}
        )
    best = answer.json()["predictions"][0]
    assert first.locator(".label").inner_text() == best["label"]
    shown = _percent(first.locator(".score").inner_text())
    assert shown == pytest.approx(best["score"], abs=0.0005)  # as rounded to show
    assert panel.locator(".bars li").count() == 5
    expect(panel.locator(".timing")).to_contain_text("ms")
    (call,) = [r for r in seen.requests if urlsplit(r.url).path == "/classify"]
    assert call.method == "POST" and parse_qs(urlsplit(call.url).query) == {
        "model": ["tiny-vision"],
        "top_k": ["5"],
    }
    assert call.headers["content-type"].startswith("multipart/form-data")
    assert 'name="file"; filename="cifar10-test-03000-cat.jpg"' in (call.post_data or "")


def test_fill_mask_shows_the_first_prediction(visit: Callable[..., Visit], server: RunningServer) -> None:
    seen = visit()
    panel = _fill_mask(seen.page)
    text = "the cat sat on the [MASK]."
    panel.locator("textarea").fill(text)
    panel.get_by_role("button", name="Predict").click()
    expect(panel.locator(".filled mark")).to_be_visible()
    with server.client() as client:
        ranked = client.post("/fill-mask", json={"text": text, "model": "tiny-mlm"}).json()["predictions"][0]
    assert panel.locator(".filled mark").inner_text() == ranked[0]["token_str"]
    assert panel.locator(".filled").inner_text() == text.replace("[MASK]", ranked[0]["token_str"])
    assert panel.locator(".bars li .label").all_inner_texts() == [p["token_str"] for p in ranked]
    (call,) = [r for r in seen.requests if urlsplit(r.url).path == "/fill-mask"]
    assert call.post_data_json == {"model": "tiny-mlm", "text": text, "top_k": 5}


def test_errors_are_shown_as_the_server_words_them(
    visit: Callable[..., Visit], server: RunningServer
) -> None:
    seen = visit()
    seen.expected += [
        "the server responded with a status of 413",
        "the server responded with a status of 422",
    ]
    oversized = {"name": "photo.jpg", "mimeType": "image/jpeg", "buffer": b"\xff\xd8" + bytes(UPLOAD_LIMIT)}
    classifier = _classifier(seen.page)
    classifier.locator("input[type=file]").set_input_files(oversized)
    error = classifier.locator(".error")
    expect(error).to_contain_text("HTTP 413")
    with server.client() as client:
        too_large = client.post("/classify", files={"file": oversized["buffer"]}).json()["error"]
        no_mask = client.post("/fill-mask", json={"text": "no mask here"}).json()["error"]
    expect(error.locator(".message")).to_have_text(too_large["message"])
    expect(error).to_contain_text(too_large["code"])

    fill_mask = _fill_mask(seen.page)
    fill_mask.locator("textarea").fill("no mask here")
    fill_mask.get_by_role("button", name="Predict").click()
    expect(fill_mask.locator(".error")).to_contain_text("HTTP 422")
    expect(fill_mask.locator(".error .message")).to_have_text(no_mask["message"])


def test_keyboard_only(visit: Callable[..., Visit]) -> None:
    """Insert [MASK] and predict without a mouse; the sample images are buttons."""
    seen = visit()
    page, panel = seen.page, _fill_mask(seen.page)
    textarea = panel.locator("textarea")
    textarea.focus()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type("paris is the ")
    page.keyboard.press("Tab")
    expect(panel.get_by_role("button", name="Insert [MASK]")).to_be_focused()
    page.keyboard.press("Enter")
    expect(textarea).to_be_focused()
    page.keyboard.type(" of france.")
    page.keyboard.press("Control+Enter")
    expect(panel.locator(".filled mark")).to_be_visible()
    assert textarea.input_value() == "paris is the [MASK] of france."

    sample = _classifier(page).get_by_role("button", name="sample: cat")
    sample.focus()
    page.keyboard.press("Enter")
    expect(_classifier(page).locator(".bars li").first).to_be_visible()


def test_status_strip_counts_the_requests(visit: Callable[..., Visit]) -> None:
    seen = visit()
    page = seen.page
    expect(page.locator("#s-status")).to_have_text("ready")
    count = page.locator("#s-requests")
    expect(count).to_have_text(re.compile(r"^\d"))
    before = int(count.inner_text().replace(",", ""))
    _classifier(page).get_by_role("button", name="sample: dog").click()
    expect(_classifier(page).locator(".bars li").first).to_be_visible()
    expect(count).not_to_have_text(str(before), timeout=10_000)
    assert int(count.inner_text().replace(",", "")) > before
    expect(page.locator("#s-p50")).to_contain_text("ms")


def _exercise(seen: Visit) -> None:
    """Classify the cat and fill a mask, so that results are on the page."""
    _classifier(seen.page).locator("input[type=file]").set_input_files(CAT_JPEG)
    panel = _fill_mask(seen.page)
    panel.locator("textarea").fill("the cat sat on the [MASK].")
    panel.get_by_role("button", name="Predict").click()
    expect(_classifier(seen.page).locator(".bars li").first).to_be_visible()
    expect(panel.locator(".filled mark")).to_be_visible()


def test_the_page_calls_only_its_documented_api(visit: Callable[..., Visit], server: RunningServer) -> None:
    seen = visit()
    seen.page.locator("#key").fill("test-key")
    seen.page.locator("#key").press("Enter")
    _exercise(seen)
    with server.client() as client:
        documented = client.get("/openapi.json").json()["paths"]
    calls = seen.api_calls()
    assert set(calls) == PAGE_API, calls
    files = seen.own_files()
    assert {urlsplit(r.url).path for r in files} >= {"/", "/ui/app.js", "/ui/style.css"}
    for file in files:
        response = file.response()
        assert response is not None and response.status == 200, file.url
    for method, path in calls:
        assert method.lower() in documented[path]
    authorised = [r for r in seen.requests if (r.method, urlsplit(r.url).path) in PAGE_API]
    after_key = [r for r in authorised if r.headers.get("authorization")]
    assert after_key and all(r.headers["authorization"] == "Bearer test-key" for r in after_key)
    assert {urlsplit(r.url).path for r in after_key} >= {"/classify", "/fill-mask"}


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_screenshots_and_accessibility(
    visit: Callable[..., Visit], artifacts: Path, viewport: dict[str, int], request: pytest.FixtureRequest
) -> None:
    # axe is injected as a script, which the page's Content-Security-Policy would refuse.
    seen = visit(viewport=viewport, bypass_csp=True)
    _exercise(seen)
    page = seen.page
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]  # no sideways scroll
    name = request.node.callspec.id
    page.screenshot(path=artifacts / f"{name}.png", full_page=True)
    page.add_script_tag(path=AXE)
    report = page.evaluate("axe.run(document)")
    summary = {
        "axe": page.evaluate("axe.version"),
        "violations": [
            {"id": v["id"], "impact": v["impact"], "nodes": len(v["nodes"])} for v in report["violations"]
        ],
        "passes": len(report["passes"]),
        "incomplete": [v["id"] for v in report["incomplete"]],
    }
    (artifacts / f"axe-{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    assert not report["violations"], json.dumps(report["violations"], indent=2)[:4000]


def test_docs_work_offline(visit: Callable[..., Visit], server: RunningServer) -> None:
    with server.client() as client:
        documented = client.get("/openapi.json").json()["paths"]
    operations = sum(len(methods) for methods in documented.values())
    swagger = visit("/docs")
    expect(swagger.page.locator(".opblock")).to_have_count(operations, timeout=30_000)
    expect(swagger.page.locator(".opblock-summary-path", has_text="/classify")).to_be_visible()
    # ReDoc always tries its maker's logo from their CDN; the page's policy stops it in the browser.
    redoc = visit("/redoc")
    redoc.failing = ("error",)
    redoc.expected.append("Loading the image 'https://cdn.redoc.ly/redoc/logo-mini.svg' violates")
    expect(redoc.page.get_by_text("Classify an image").first).to_be_attached(timeout=30_000)
