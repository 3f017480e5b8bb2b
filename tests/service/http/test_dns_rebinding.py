"""DNS rebinding against a real server: without API keys a request that names a host of its own
(what a browser sends once a page's name resolves to the server) gets 421 `host_not_allowed` in its
route's API shape, naming the setting; IP addresses, localhost and the names of `allowed_hosts`
are answered; with API keys every name is answered (a browser cannot add the key)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from service.http.hosts import HostRule, host_name
from service.http.parsing import TINY_PNG_BASE64
from service.settings import ServiceSettings
from support.keys import bearer, write_keys
from support.raw_http import raw_request

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)
PNG = base64.b64decode(TINY_PNG_BASE64)
HTML = {"Accept": "text/html"}
REBOUND = "attacker.example:8000"  # the page's own name, now resolving to this server


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server()


@pytest.fixture(scope="module")
def named(start_server: Any) -> RunningServer:
    return start_server(allowed_hosts="api, .example.com")


def _request(server: RunningServer, method: str, path: str, host: str, **options: Any) -> Any:
    headers = {"Host": host, **options.pop("headers", {})}
    with server.client() as client:
        return client.request(method, path, headers=headers, **options)


def _classify(server: RunningServer, host: str, **headers: str) -> Any:
    return _request(
        server, "POST", "/classify", host, content=PNG, headers={"Content-Type": "image/png", **headers}
    )


def test_a_rebound_name_is_refused_on_every_api(server: RunningServer) -> None:
    classify = _classify(server, REBOUND)
    assert classify.status_code == 421
    error = classify.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert "GMLP_ALLOWED_HOSTS" in error["message"] and "attacker.example" in error["message"]
    v2 = _request(server, "GET", "/v2", REBOUND)
    assert v2.status_code == 421 and "GMLP_ALLOWED_HOSTS" in v2.json()["error"]  # the protocol's shape
    hf = _request(server, "POST", "/models/tiny-vision", REBOUND, content=PNG)
    assert hf.status_code == 421 and "GMLP_ALLOWED_HOSTS" in hf.json()["error"]  # Hugging Face's shape
    page = _request(server, "GET", "/", REBOUND, headers=HTML)
    assert page.status_code == 421 and "text/html" not in page.headers["content-type"]
    for path in ("/health/ready", "/v2/health/ready", "/metrics"):
        assert _request(server, "GET", path, REBOUND).status_code == 421, path


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:{port}", "LOCALHOST:{port}", "localhost.", "[::1]:{port}", "10.0.0.7"]
)
def test_addresses_and_localhost_are_answered(server: RunningServer, host: str) -> None:
    host = host.format(port=server.port)
    assert _classify(server, host).status_code == 200
    assert _request(server, "GET", "/v2", host).status_code == 200
    page = _request(server, "GET", "/", host, headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_probes_without_a_host_are_answered(server: RunningServer) -> None:
    """HTTP/1.0 without Host: a load balancer's health check (HAProxy's default), never a browser."""
    assert raw_request(server.port, "GET", "/health/ready", version="HTTP/1.0", host=False)[0] == 200


@pytest.mark.parametrize("host", ["", "attacker.example:80:80", "[::1", "::1", "127.0.0.1.attacker.example"])
def test_what_is_not_a_plain_address_or_name_is_refused(server: RunningServer, host: str) -> None:
    status, _ = raw_request(server.port, "GET", "/health/live", [("Host", host)], host=False)
    assert status == 421


@pytest.mark.parametrize(
    "host", ["api", "api:8000", "example.com", "gmlp.example.com:443", "A.B.EXAMPLE.COM"]
)
def test_the_allowed_names_are_answered(named: RunningServer, host: str) -> None:
    assert _classify(named, host).status_code == 200
    assert _request(named, "GET", "/v2", host).status_code == 200


@pytest.mark.parametrize("host", ["api.attacker.example", "badexample.com", "example.com.attacker.example"])
def test_names_outside_the_allowed_ones_are_refused(named: RunningServer, host: str) -> None:
    assert _classify(named, host).status_code == 421


def test_with_api_keys_any_name_is_answered_with_a_key(start_server: Any, tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys", client="infer")
    server = start_server(api_keys_file=tmp_path / "keys")
    assert _classify(server, REBOUND, **bearer(keys["client"])).status_code == 200
    assert _request(server, "GET", "/v2", REBOUND, headers=bearer(keys["client"])).status_code == 200
    assert _classify(server, REBOUND).status_code == 401  # and a browser has no key to add


def test_star_answers_any_name(start_server: Any) -> None:
    assert _classify(start_server(allowed_hosts="*"), REBOUND).status_code == 200


def test_the_rule_and_the_setting() -> None:
    assert host_name("[::1]:8000") == ("::1", True) and host_name("Example.COM.:80") == ("example.com", False)
    assert host_name("[::1]x") is None and host_name("a:b") is None
    rule = HostRule.from_setting(".Example.com., api", keyed=False)
    assert (
        rule.allows("x.example.com", False) and rule.allows("api", False) and not rule.allows("apix", False)
    )
    assert HostRule.from_setting(None, keyed=True).any_host
    for wrong in ("http://api", "api:8000", "a b"):
        with pytest.raises(ValueError, match="not a host name"):
            ServiceSettings(allowed_hosts=wrong)
