"""Per-key rate limits (429 + Retry-After over REST, RESOURCE_EXHAUSTED over gRPC), CORS by opt-in,
and /metrics on a port of its own for scrapers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.keys import bearer, write_keys

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.timeout(180)

ORIGIN = "https://app.example.com"


def test_a_key_over_its_rate_gets_429_with_retry_after(
    start_server: Any, tmp_path: Path, grpc_port: Any
) -> None:
    # A rate far below what the test sends: the burst passes, the next one is refused.
    keys = write_keys(tmp_path / "keys", slow="infer rate=0.01 burst=3", free="infer", ops="metrics")
    server = start_server(
        api_keys_file=tmp_path / "keys",
        grpc_port=grpc_port(),
        client_options={"headers": bearer(keys["ops"])},
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        statuses = [client.get("/models", headers=bearer(keys["slow"])).status_code for _ in range(3)]
        refused = client.get("/models", headers=bearer(keys["slow"]))
        unlimited = [client.get("/models", headers=bearer(keys["free"])).status_code for _ in range(10)]
    assert statuses == [200, 200, 200] and set(unlimited) == {200}
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limited" and "slow" in refused.json()["error"]["message"]
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ServerMetadata(
                pb.ServerMetadataRequest(), metadata=[("x-api-key", keys["slow"])], timeout=30
            )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(caught.value.trailing_metadata())["retry-after"]) >= 1
    assert (
        server.metric("gmlp_api_key_requests_total", key="slow", transport="grpc", outcome="rate_limited")
        == 1
    )
    assert server.metric("gmlp_api_key_requests_total", key="slow", transport="http", outcome="allowed") == 3


def test_cors_is_off_by_default(start_server: Any) -> None:
    server = start_server()
    with server.client() as client:
        answer = client.get("/models", headers={"Origin": ORIGIN})
        preflight = client.options(
            "/classify", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        )
    assert "access-control-allow-origin" not in answer.headers
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_allows_the_listed_origins_and_answers_preflights_before_access(
    start_server: Any, tmp_path: Path
) -> None:
    keys = write_keys(tmp_path / "keys", client="infer")
    server = start_server(api_keys_file=tmp_path / "keys", cors_origins=f"{ORIGIN}, https://other.example")
    request_headers = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    with httpx.Client(base_url=server.url, timeout=30) as client:
        preflight = client.options("/classify", headers={"Origin": ORIGIN, **request_headers})
        stranger = client.options("/classify", headers={"Origin": "https://evil.example", **request_headers})
        refused = client.get("/models", headers={"Origin": ORIGIN})
        allowed = client.get("/models", headers={"Origin": ORIGIN, **bearer(keys["client"])})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in preflight.headers  # only when configured
    assert stranger.status_code == 400 and "access-control-allow-origin" not in stranger.headers
    # A refusal carries the CORS headers too, so that a browser page can read why.
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN


def test_cors_credentials_only_when_configured(start_server: Any) -> None:
    server = start_server(cors_origins=ORIGIN, cors_credentials=True)
    with server.client() as client:
        preflight = client.options(
            "/classify", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        )
    assert preflight.headers["access-control-allow-credentials"] == "true"


def test_metrics_on_a_port_of_their_own(start_server: Any, tmp_path: Path) -> None:
    from support.servers import free_port

    keys = write_keys(tmp_path / "keys", client="infer")
    port = free_port()
    server = start_server(api_keys_file=tmp_path / "keys", metrics_port=port)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/metrics").status_code == 401  # the main port still needs a metrics key
        assert client.get("/models", headers=bearer(keys["client"])).status_code == 200
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert scraped.status_code == 200
    families = {family.name for family in text_string_to_metric_families(scraped.text)}
    assert {"gmlp_http_requests", "gmlp_api_key_requests"} <= families
    assert keys["client"] not in scraped.text
