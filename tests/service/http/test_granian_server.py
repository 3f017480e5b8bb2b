"""`gmlp serve --server granian`: the product's own command under Granian, as a user starts it (a
child process): it serves, answers bad requests in the service's error shape, and drains on
SIGTERM. The rest of the suite runs under Granian with GMLP_TEST_SERVER=granian (tests/support/servers.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gmlp.server_process import ServerProcess, gmlp_serve
from loadtests.checks import check_classify
from service.granian_server import settings_environment
from service.settings import ServiceSettings

pytest.importorskip("granian")


@pytest.fixture(scope="module")
def granian_server(tmp_path_factory: pytest.TempPathFactory, repository: Path) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("granian") / "server.log"
    server = gmlp_serve(
        repository, log_path=log, serve_args=["--server", "granian", "--max-header-bytes", "4096"]
    )
    with server:
        yield server


def _post(
    url: str, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": content_type, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_it_serves_the_app(granian_server: ServerProcess, cifar_images: list[bytes]) -> None:
    status, body = _post(
        f"{granian_server.base_url}/classify?model=tiny-vision&top_k=3", cifar_images[0], "image/jpeg"
    )
    assert status == 200 and check_classify(body, 3, "tiny-vision") is None
    with urllib.request.urlopen(f"{granian_server.base_url}/health/live", timeout=10) as response:
        assert response.headers["server"] == "granian"  # it is Granian answering, not uvicorn


def test_errors_keep_the_service_shape(granian_server: ServerProcess) -> None:
    status, body = _post(f"{granian_server.base_url}/classify?model=nope", b"xx", "image/jpeg")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = _post(
        f"{granian_server.base_url}/classify", b"xx", "image/jpeg", headers={"X-Padding": "a" * 8000}
    )
    assert status == 431 and "4096" in body["error"]["message"]


def test_sigterm_drains_and_exits(tmp_path: Path, repository: Path) -> None:
    server = gmlp_serve(repository, log_path=tmp_path / "server.log", serve_args=["--server", "granian"])
    with server:
        pass  # __exit__ sends SIGTERM and waits
    assert server.proc is not None and server.proc.returncode == 0, server.log_tail()
    assert "drained and closed" in server.log_tail()


def test_the_settings_reach_the_worker_unchanged(
    monkeypatch: pytest.MonkeyPatch, make_settings: Callable[..., ServiceSettings]
) -> None:
    """Granian's worker builds the app from its environment: every setting survives the trip."""
    settings = make_settings(max_connections=7, cors_origins="https://app.example", ui=False, cpus=None)
    for key, value in settings_environment(settings).items():
        monkeypatch.setenv(key, value)
    assert ServiceSettings() == settings
