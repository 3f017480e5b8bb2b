"""Odd forms of every route's path (trailing `%0A`/`%0D`/`%00`, `%2F`, dot segments, double
slashes, case, trailing slash, percent-encoded letters) against a real server with keys: the status
each key gets agrees with the scope of the route that actually answered, never a 200 from a route
whose scope the key lacks.

Which route answered is read from the server's own request counter (labelled with the route the
router recorded), not from the access layer; the scope each route needs is this file's own table,
written from the documented access rule (docs/security.md), not read from the code under test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import BaseRoute, Mount

from service.app import ROUTERS
from support.keys import bearer
from support.raw_http import raw_request

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(300)

# The documented rule: open probes and pages, admin below /v2/repository, metrics, infer for the rest.
OPEN = {
    "/",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/favicon.ico",
    "/openapi.json",
    "/health/live",
    "/health/ready",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/{name}/ready",
    "/v2/models/{name}/versions/{version}/ready",
    "/ui",
    "/ui/vendor",
}
UNMATCHED = "<unmatched>"


def expected_scope(template: str) -> str | None:
    if template in OPEN:
        return None
    if template.startswith("/v2/repository/"):
        return "admin"
    if template == "/metrics":
        return "metrics"
    return "infer"


# Each key of the module's keys file with the scopes it holds; None: no key.
KEYS: dict[str | None, set[str]] = {"client": {"infer"}, "ops": {"metrics"}, "admin": {"admin"}, None: set()}
PARAMS = {"name": "tiny-mlm", "version": "1"}


def _routes() -> list[tuple[str, str]]:
    """(method, a concrete path) for every route of the app: the routers' routes with their
    parameters filled, FastAPI's OpenAPI document and a file under each mount."""
    routes: list[BaseRoute] = [route for router in ROUTERS for route in router.routes]
    found = [("GET", "/openapi.json"), ("GET", "/ui/app.js"), ("GET", "/ui/vendor/swagger-ui.css")]
    for route in routes:
        if isinstance(route, Mount):
            continue
        path = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: PARAMS[m.group(1)], route.path)  # type: ignore[attr-defined]
        for method in sorted(route.methods or ()):  # type: ignore[attr-defined]
            if method != "HEAD":
                found.append((method, path))
    return found


ROUTES = _routes()


def _encoded(char: str) -> str:
    return f"%{ord(char):02X}"


# Each form: a function of the concrete path.
FORMS = {
    "newline": lambda p: p + "%0A",
    "carriage return": lambda p: p + "%0D",
    "crlf": lambda p: p + "%0D%0A",
    "nul": lambda p: p + "%00",
    "encoded newline inside": lambda p: p.replace("/", "/%0A", 1) if p != "/" else p + "%0A",
    "encoded slashes": lambda p: "/" + p[1:].replace("/", "%2F"),
    "dot segment": lambda p: p.replace("/", "/./", 1),
    "dot-dot segment": lambda p: p.replace("/", "/x/../", 1),
    "encoded dot-dot": lambda p: p.replace("/", "/x/%2E%2E/", 1),
    "leading double slash": lambda p: "/" + p,
    "inner double slash": lambda p: p[:1] + p[1:].replace("/", "//", 1),
    "upper case": str.upper,
    "swapped case": str.swapcase,
    "trailing slash": lambda p: p + "/",
    "encoded letter": lambda p: re.sub(r"[a-z]", lambda m: f"%{ord(m.group()):02X}", p, count=1),
    "encoded upper letter": lambda p: re.sub(
        r"[a-z]", lambda m: f"%{ord(m.group().upper()):02X}", p, count=1
    ),
    "up from a mount": lambda p: "/ui/.." + p,
}


@pytest.fixture(scope="module")
def server(start_server: Any, keys_file: tuple[Path, dict[str, str]]) -> RunningServer:
    path, keys = keys_file
    return start_server(api_keys_file=path, client_options={"headers": bearer(keys["all"])})


def _answered(server: RunningServer, before: dict[Any, float]) -> tuple[str, dict[Any, float]]:
    """The route label of the one request counted since `before` (the scrape itself aside)."""
    now = server.metrics()
    grown = {
        labels
        for (name, labels), value in now.items()
        if name == "gmlp_http_requests_total" and value > before.get((name, labels), 0)
    }
    routes = {dict(labels)["route"] for labels in grown} - {"/metrics"}
    if not routes:  # the form was /metrics itself
        routes = {dict(labels)["route"] for labels in grown}
    assert len(routes) == 1, grown
    return routes.pop(), now


def check(server: RunningServer, keys: dict[str, str], method: str, target: str) -> None:
    """With every key, the status agrees with the scope of the route that answered `target`."""
    before = server.metrics()
    status, _ = raw_request(server.port, method, target, bearer(keys["all"]))
    route, _ = _answered(server, before)
    assert status < 500, (method, target, status)
    if route == UNMATCHED:
        # No route recorded itself: either nothing answered (no key gets a 200), or a file of the
        # open mounts did (the one kind of route that records no template: every key gets it).
        for name in KEYS:
            got, _ = raw_request(server.port, method, target, bearer(keys[name]) if name else {})
            assert got == status if status == 200 else got != 200 and got < 500, (method, target, name, got)
        return
    scope = expected_scope(route)
    for name, held in KEYS.items():
        headers = bearer(keys[name]) if name is not None else {}
        got, body = raw_request(server.port, method, target, headers)
        if scope is None or scope in held:
            assert got == status, (method, target, name, route, got, status)
        else:
            assert got in (401, 403), (method, target, name, route, got, body[:200])
        assert not (got == 200 and scope is not None and scope not in held), (method, target, name, route)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_route_in_every_odd_form(server: RunningServer, keys_file: Any, form: str) -> None:
    _, keys = keys_file
    for method, path in ROUTES:
        check(server, keys, method, FORMS[form](path))


def test_control_characters_in_a_path_reach_no_route(server: RunningServer, keys_file: Any) -> None:
    """The router's `$` also matches before a final newline: such paths are refused, with every key."""
    _, keys = keys_file
    for method, path in ROUTES:
        for suffix in ("%0A", "%0D", "%00", "%0D%0A", "%7F", "%C2%85", "%E2%80%A8"):
            status, _ = raw_request(server.port, method, path + suffix, bearer(keys["all"]))
            assert status == 404, (method, path + suffix, status)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), forms=st.lists(st.sampled_from(sorted(FORMS)), min_size=1, max_size=3))
def test_composed_odd_forms(
    server: RunningServer, keys_file: Any, route: tuple[str, str], forms: list[str]
) -> None:
    _, keys = keys_file
    method, target = route
    for form in forms:
        target = FORMS[form](target)
    check(server, keys, method, target)
