"""Every route family with no key, a wrong key, a key without the scope and the right key, over REST
and gRPC: the status, the error shape, and that nothing ran for a refused request (no batch)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest

from service.access.keys import new_key
from service.v2.proto import grpc_predict_v2_pb2 as pb
from service.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from support.keys import bearer

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

V2_INFER_BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a [MASK] day"]}]}

# (family, method, path, body kind, scope, the shape of its refusals)
REST_ROUTES = [
    ("classify", "POST", "/classify", "image", "infer", "rest"),
    ("fill-mask", "POST", "/fill-mask", "fill", "infer", "rest"),
    ("models", "GET", "/models", None, "infer", "rest"),
    ("hf", "POST", "/models/tiny-mlm", "hf", "infer", "hf"),
    ("v2 infer", "POST", "/v2/models/tiny-mlm/infer", "v2", "infer", "v2"),
    ("v2 metadata", "GET", "/v2/models/tiny-mlm", None, "infer", "v2"),
    ("v2 server", "GET", "/v2", None, "infer", "v2"),
    ("metrics", "GET", "/metrics", None, "metrics", "rest"),
    ("repository", "POST", "/v2/repository/index", None, "admin", "v2"),
]
OPEN_PATHS = [
    "/health/live",
    "/health/ready",
    "/v2/health/ready",
    "/v2/models/tiny-mlm/ready",
    "/openapi.json",
]
# A key that holds another scope than the route's.
OTHER = {"infer": "ops", "metrics": "client", "admin": "client"}
RIGHT = {"infer": "client", "metrics": "ops", "admin": "admin"}


@pytest.fixture(scope="module")
def server(start_server: Any, keys_file: tuple[Path, dict[str, str]], grpc_port: Any) -> RunningServer:
    path, keys = keys_file
    return start_server(
        api_keys_file=path, grpc_port=grpc_port(), client_options={"headers": bearer(keys["ops"])}
    )


def _request(
    client: httpx.Client, method: str, path: str, body: str | None, image: bytes, **kw: Any
) -> httpx.Response:
    if body == "image":
        return client.post(
            path, content=image, headers={"Content-Type": "image/jpeg", **kw.pop("headers", {})}, **kw
        )
    payload = {"fill": {"text": "a [MASK] day"}, "hf": {"inputs": "a [MASK] day"}, "v2": V2_INFER_BODY}
    if body is not None:
        return client.request(method, path, json=payload[body], **kw)
    return client.request(method, path, **kw)


def _batches(server: RunningServer) -> float:
    return sum(
        value for (name, _labels), value in server.metrics().items() if name == "gmlp_batch_size_count"
    )


def _message(response: httpx.Response, shape: str) -> str:
    body = response.json()
    if shape == "rest":
        return body["error"]["message"] + " " + body["error"]["code"]
    assert isinstance(body["error"], str)
    return body["error"]


@pytest.mark.parametrize(
    ("family", "method", "path", "body", "scope", "shape"), REST_ROUTES, ids=[r[0] for r in REST_ROUTES]
)
def test_rest_routes_need_the_key_of_their_scope(
    server: RunningServer,
    keys_file: tuple[Path, dict[str, str]],
    cifar_images: list[bytes],
    family: str,
    method: str,
    path: str,
    body: str | None,
    scope: str,
    shape: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    keys = keys_file[1]
    image = cifar_images[0]
    before = _batches(server)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        none = _request(client, method, path, body, image)
        wrong = _request(client, method, path, body, image, headers=bearer(new_key()))
        other = _request(client, method, path, body, image, headers={"x-api-key": keys[OTHER[scope]]})
        assert _batches(server) == before, "a refused request reached a batch"
        right = _request(client, method, path, body, image, headers=bearer(keys[RIGHT[scope]]))
        by_header = _request(client, method, path, body, image, headers={"x-api-key": keys[RIGHT[scope]]})
    for refused in (none, wrong):
        assert refused.status_code == 401, (family, refused.text)
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "unauthenticated" in _message(refused, shape) or "API key" in _message(refused, shape)
    assert other.status_code == 403 and "www-authenticate" not in other.headers
    assert scope in _message(other, shape)
    # The right key passes access control.
    assert right.status_code == by_header.status_code == 200, (family, right.text)
    if family in ("classify", "fill-mask", "hf", "v2 infer"):
        assert _batches(server) > before
    _no_key_in(caplog.text, keys, [none, wrong, other, right, by_header])


def _no_key_in(logged: str, keys: dict[str, str], responses: list[httpx.Response]) -> None:
    """No key, valid or not, in the server's log lines or in any answer."""
    for key in keys.values():
        assert key not in logged
        for response in responses:
            assert key not in response.text and all(key not in value for value in response.headers.values())


def test_open_routes_need_no_key(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for path in OPEN_PATHS:
            assert client.get(path).status_code == 200, path
        # A wrong key on an open route is not looked at.
        assert client.get("/health/ready", headers=bearer(new_key())).status_code == 200


def test_openapi_declares_both_schemes_and_the_open_routes(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        doc = client.get("/openapi.json").json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"]["in"] == "header" and schemes["apiKey"]["name"] == "x-api-key"
    classify = doc["paths"]["/classify"]["post"]
    assert (
        classify["security"] == [{"bearer": []}, {"apiKey": []}] and classify["x-required-scope"] == "infer"
    )
    assert doc["paths"]["/health/ready"]["get"]["security"] == []


def test_per_key_metrics_by_name_and_outcome(
    server: RunningServer, keys_file: tuple[Path, dict[str, str]]
) -> None:
    keys = keys_file[1]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.get("/models", headers=bearer(keys["client"]))
        client.get("/models", headers=bearer(keys["ops"]))
        client.get("/models", headers=bearer(new_key()))
    samples = server.metrics()
    count = lambda **labels: samples.get(("gmlp_api_key_requests_total", tuple(sorted(labels.items()))), 0)  # noqa: E731
    assert count(key="client", transport="http", outcome="allowed") >= 1
    assert count(key="ops", transport="http", outcome="forbidden") >= 1
    assert count(key="invalid", transport="http", outcome="unauthenticated") >= 1
    names = {dict(labels)["key"] for (name, labels) in samples if name == "gmlp_api_key_requests_total"}
    assert names <= {"client", "ops", "admin", "all", "invalid", "anonymous"}
    assert samples[("gmlp_api_keys", ())] == 4


def _call(
    channel: grpc.Channel, method: str, request: Any, response: Any, key: str | None
) -> grpc.StatusCode:
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )
    metadata = [("authorization", f"Bearer {key}")] if key is not None else None
    try:
        call(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tiny-mlm")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"a [MASK] day")
    return request


GRPC_METHODS = [
    ("ModelInfer", _infer_request(), pb.ModelInferResponse, "infer", grpc.StatusCode.OK),
    (
        "ModelMetadata",
        pb.ModelMetadataRequest(name="tiny-mlm"),
        pb.ModelMetadataResponse,
        "infer",
        grpc.StatusCode.OK,
    ),
    ("ServerMetadata", pb.ServerMetadataRequest(), pb.ServerMetadataResponse, "infer", grpc.StatusCode.OK),
    (
        "RepositoryIndex",
        pb.RepositoryIndexRequest(),
        pb.RepositoryIndexResponse,
        "admin",
        grpc.StatusCode.OK,
    ),
]


@pytest.mark.parametrize(
    ("method", "request_", "response", "scope", "served"), GRPC_METHODS, ids=[m[0] for m in GRPC_METHODS]
)
def test_grpc_methods_need_the_key_of_their_scope(
    server: RunningServer,
    keys_file: tuple[Path, dict[str, str]],
    method: str,
    request_: Any,
    response: Any,
    scope: str,
    served: grpc.StatusCode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    keys = keys_file[1]
    before = _batches(server)
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        assert _call(channel, method, request_, response, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _call(channel, method, request_, response, new_key()) == grpc.StatusCode.UNAUTHENTICATED
        assert (
            _call(channel, method, request_, response, keys[OTHER[scope]])
            == grpc.StatusCode.PERMISSION_DENIED
        )
        assert _batches(server) == before
        assert _call(channel, method, request_, response, keys[RIGHT[scope]]) == served
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready  # open
        assert stub.ModelReady(pb.ModelReadyRequest(name="tiny-mlm"), timeout=30).ready
    with (
        pytest.raises(grpc.RpcError) as caught,
        grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel,
    ):
        pb_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(
            pb.ServerMetadataRequest(), metadata=[("authorization", "Bearer " + keys["ops"])], timeout=30
        )
    assert "infer" in caught.value.details() and keys["ops"] not in caught.value.details()
    _no_key_in(caplog.text, keys, [])


def test_without_keys_admin_is_closed_and_the_rest_is_open(start_server: Any, grpc_port: Any) -> None:
    server = start_server(grpc_port=grpc_port())
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/models").status_code == 200
        assert client.get("/metrics").status_code == 200
        closed = client.post("/v2/repository/index", headers=bearer(new_key()))
    assert closed.status_code == 403 and "admin" in json.loads(closed.text)["error"]
    with grpc.insecure_channel(f"127.0.0.1:{server.settings.grpc_port}") as channel:
        assert (
            _call(channel, "ServerMetadata", pb.ServerMetadataRequest(), pb.ServerMetadataResponse, None)
            == grpc.StatusCode.OK
        )
        assert (
            _call(channel, "RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse, None)
            == grpc.StatusCode.PERMISSION_DENIED
        )
