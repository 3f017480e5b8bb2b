"""The one way the lifecycle tests start a server with the model-repository API, and talk to it.

Every server these tests start goes through `start_repository_server`, and every stock client
through `triton_http` / `triton_grpc` (which add `CONTROL_HEADERS` to each call): where the
repository API needs credentials, they are added here and nowhere else.

`versioned_repository` lays exported directories out as `NAME/1/`, `NAME/2/`, ... in a fresh folder.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from support.keys import bearer, write_keys
from support.servers import RunningServer, free_port

# The repository API is an admin route: closed unless an admin key is configured. Every server
# these tests start holds one key with every scope, in a keys file of its own.
_KEYS_DIR = Path(tempfile.mkdtemp(prefix="gmlp-repository-keys-"))
atexit.register(shutil.rmtree, _KEYS_DIR, True)
_KEYS_FILE = _KEYS_DIR / "api-keys"
_OPERATOR_KEY = write_keys(_KEYS_FILE, operator="admin,infer,metrics")["operator"]

# Headers every call of these tests carries: the operator's key (lower-case names: gRPC metadata
# keys must be).
CONTROL_HEADERS: dict[str, str] = {name.lower(): value for name, value in bearer(_OPERATOR_KEY).items()}


def start_repository_server(start_server: Callable[..., RunningServer], **overrides: Any) -> RunningServer:
    """A ready server (HTTP and gRPC on free ports) with the given settings and the operator's key;
    the server's own httpx clients send the key too."""
    overrides.setdefault("api_keys_file", _KEYS_FILE)
    return start_server(grpc_port=free_port(), client_options={"headers": control_headers()}, **overrides)


class _WithHeaders:
    """A stock client whose every call carries `CONTROL_HEADERS`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or not CONTROL_HEADERS or name.startswith("_"):
            return attribute
        return functools.partial(attribute, headers=dict(CONTROL_HEADERS))


def triton_http(server: RunningServer) -> Any:
    return _WithHeaders(httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}"))


def triton_grpc(server: RunningServer) -> Any:
    return _WithHeaders(grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}"))


def is_grpc(client: Any) -> bool:
    return isinstance(getattr(client, "_client", client), grpcclient.InferenceServerClient)


def version_states(client: Any, name: str) -> dict[str, str]:
    """{version: state} of `name` in the repository index, through a stock client."""
    index = client.get_model_repository_index(**({"as_json": True} if is_grpc(client) else {}))
    entries = index.get("models", []) if is_grpc(client) else index
    return {e["version"]: e["state"] for e in entries if e["name"] == name}


def version_reasons(server: RunningServer, name: str) -> dict[str, str]:
    """{version: reason} of `name` in the repository index (REST)."""
    with server.client() as client:
        index = client.post("/v2/repository/index", headers=control_headers()).json()
    return {e["version"]: e["reason"] for e in index if e["name"] == name}


def control_headers() -> dict[str, str]:
    """For raw HTTP calls (httpx) to the repository API."""
    return dict(CONTROL_HEADERS)


def versioned_repository(root: Path, models: dict[str, dict[int, Path]]) -> Path:
    """`root/NAME/V/` copies of the given exported directories; returns `root`."""
    for name, versions in models.items():
        for version, source in versions.items():
            add_version(root, name, version, source)
    return root


def add_version(root: Path, name: str, version: int, source: Path) -> Path:
    """Deploy `source` as version `version` of `name` the atomic way: copy beside, then one rename."""
    staging = root / f".{name}-{version}.partial"
    shutil.copytree(source, staging)
    target = root / name / str(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return target


def v2_image_request(image: bytes) -> tuple[bytes, dict[str, str]]:
    """A v2 REST request body with one encoded image as a binary BYTES tensor (JSON header, then
    the element: 4-byte little-endian length and the bytes), and its headers."""
    import json
    import struct

    element = struct.pack("<I", len(image)) + image
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(element)},
                }
            ]
        }
    ).encode()
    return head + element, {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


class Load:
    """A bounded load of /classify and v2 REST requests from `threads` threads, run until `stop()`
    (or `max_requests` per thread, or `max_seconds`); every answer and every failure is kept."""

    def __init__(
        self,
        server: RunningServer,
        image: bytes,
        *,
        threads: int = 4,
        max_requests: int = 3000,
        max_seconds: float = 90.0,
    ) -> None:
        import threading

        self.server, self.image = server, image
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.answers: list[tuple[str, Any]] = []  # (kind, JSON answer) in completion order
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        kinds = ["classify", "v2"]
        self._kinds = set(kinds[:threads])
        self._threads = [
            threading.Thread(target=self._run, args=(kinds[i % 2],), daemon=True) for i in range(threads)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def wait_for_answers(self, more: int, timeout: float = 60.0) -> None:
        """Bounded wait until `more` further answers came back, of each kind at least one (on a busy
        machine the threads of one kind can be starved for a while)."""
        start = self.count()

        def done() -> bool:
            with self._lock:
                answered = {kind for kind, _ in self.answers[start:]}
            return (self.count() >= start + more and answered >= self._kinds) or bool(self.failures)

        self.server.wait_for(done, timeout=timeout)

    def _run(self, kind: str) -> None:
        import time

        deadline = time.monotonic() + self.max_seconds
        body, headers = v2_image_request(self.image)
        with self.server.client(timeout=30) as client:
            for _ in range(self.max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    if kind == "classify":
                        response = client.post("/classify?top_k=10", content=self.image)
                    else:
                        response = client.post("/v2/models/tiny-vision/infer", content=body, headers=headers)
                except Exception as exc:  # a dropped connection is a failed request too
                    with self._lock:
                        self.failures.append(f"{kind}: {exc!r}")
                    continue
                with self._lock:
                    if response.status_code == 200:
                        self.answers.append((kind, response.json()))
                    else:
                        self.failures.append(f"{kind}: {response.status_code} {response.text[:200]}")
