"""An engine and its front-ends (`workers` > 1): real `gmlp serve` process trees.

One engine process holds the models; a repository call made on any connection changes what every
connection sees once it is answered; an engine killed under load costs its rows a 503 with
Retry-After (never a hang, never a 500) and comes back; rows and their outputs cross between the
processes intact (compared with the model run directly in ONNX Runtime).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from gmlp.server_process import ServerProcess, gmlp_serve
from support.keys import bearer, write_keys
from support.process_tree import engine_of, listening_ports, workers_of


def request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own (the kernel hands new connections to any front-end)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def ready_fronts(server: ServerProcess, poll) -> None:
    poll(
        lambda: (
            engine_of(server.pid) is not None
            and sum(server.port in listening_ports(w) for w in workers_of(server.pid)) == 2
        ),
        timeout=90,
    )


@pytest.fixture
def explicit(repository: Path, tmp_path: Path, poll) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    keys = write_keys(tmp_path / "keys", operator="admin,infer,metrics")
    flags = ["--workers", "2", "--grpc-port", "0", "--model-control", "explicit"]
    flags += ["--load-model", "tiny-vision", "--api-keys-file", str(tmp_path / "keys")]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        ready_fronts(server, poll)
        yield server, bearer(keys["operator"])


def test_a_repository_call_on_one_connection_is_seen_on_every_other(explicit) -> None:
    """Explicit model control with two front-ends: once a load or unload is answered, 40 fresh
    connections (spread over both front-ends by the kernel) all see it."""
    server, key = explicit

    def readiness(model: str) -> Counter[int]:
        path = f"/v2/models/{model}/ready"
        return Counter(request(server.port, "GET", path, headers=key)[0] for _ in range(40))

    assert readiness("tiny-vision") == {200: 40}
    assert readiness("tiny-mlm") == {400: 40}  # known to the repository, not loaded
    status, _, body = request(server.port, "POST", "/v2/repository/models/tiny-mlm/load", b"{}", key)
    assert status == 200, body
    assert readiness("tiny-mlm") == {200: 40}
    status, _, body = request(server.port, "POST", "/v2/repository/models/tiny-vision/unload", b"{}", key)
    assert status == 200, body
    assert readiness("tiny-vision") == {400: 40}
    # One index, whichever front-end answers.
    indexes = {request(server.port, "POST", "/v2/repository/index", b"{}", key)[2] for _ in range(10)}
    assert len(indexes) == 1
    states = {(e["name"], e["state"]) for e in json.loads(indexes.pop())}
    assert states == {("tiny-vision", "UNAVAILABLE"), ("tiny-mlm", "READY")}
    # A refused call is refused the same way through the engine.
    status, _, body = request(server.port, "POST", "/v2/repository/models/nothing/load", b"{}", key)
    assert status == 404 and b"not in the repository" in body


def test_an_engine_killed_under_load_costs_503s_then_serves_again(
    repository: Path, tmp_path: Path, cifar_images, poll
) -> None:
    flags = ["--workers", "2", "--grpc-port", "0", "--request-timeout-s", "20"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        ready_fronts(server, poll)
        outcomes: list[tuple[int, str | None, bytes]] = []
        stop = threading.Event()

        def client() -> None:
            for _ in range(10_000):  # bounded; ends when told
                if stop.is_set():
                    return
                status, headers, body = request(
                    server.port, "POST", "/classify", cifar_images[0], {"Content-Type": "image/jpeg"}
                )
                outcomes.append((status, headers.get("Retry-After") or headers.get("retry-after"), body))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            poll(lambda: len(outcomes) >= 20, timeout=60)
            engine = engine_of(server.pid)
            assert engine is not None
            engine.send_signal(signal.SIGKILL)
            # Served again by a new engine, through the same front-ends.
            poll(lambda: (e := engine_of(server.pid)) is not None and e.pid != engine.pid, timeout=90)
            seen = len(outcomes)
            poll(lambda: len(outcomes) >= seen + 20 and outcomes[-1][0] == 200, timeout=90)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        refused = [o for o in outcomes if o[0] != 200]
        assert refused, "the kill was not seen by any request"
        for status, retry_after, body in refused:
            assert status == 503 and retry_after is not None, (status, body)
            assert json.loads(body)["error"]["code"] == "not_ready"
        assert "engine process is restarting" in b"".join(o[2] for o in refused).decode()
        assert server.proc is not None and server.proc.poll() is None


def test_rows_and_outputs_cross_intact(repository: Path, tmp_path: Path, poll) -> None:
    """v2 tensors in, every output back: as the graph gives them when run directly (ONNX Runtime
    on the served file), for batches of several rows. The layout is the default one of a server of
    5 CPUs: an engine and two front-ends."""
    flags = ["--cpus", "5", "--grpc-port", "0", "--variant", "fp32"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        ready_fronts(server, poll)
        _, _, meta = request(server.port, "GET", "/v2/models/tiny-vision")
        (entry,) = json.loads(meta)["inputs"]
        shape = [4, *entry["shape"][1:]]
        pixels = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        tensor = {"name": entry["name"], "shape": shape, "datatype": "FP32", "data": pixels.ravel().tolist()}
        body = json.dumps({"inputs": [tensor]}).encode()
        status, _, answer = request(
            server.port, "POST", "/v2/models/tiny-vision/infer", body, {"Content-Type": "application/json"}
        )
        assert status == 200, answer
        outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.loads(answer)["outputs"]}
        session = ort.InferenceSession(str(repository / "tiny-vision" / "model.onnx"))
        names = [o.name for o in session.get_outputs()]
        direct = dict(zip(names, session.run(None, {entry["name"]: pixels}), strict=True))
        assert set(outputs) == set(direct)
        for name, value in direct.items():
            np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-5)


def test_sigterm_drains_the_front_ends_then_the_engine(
    repository: Path, tmp_path: Path, cifar_images, poll
) -> None:
    """A request in flight when SIGTERM arrives is answered: the front-ends drain first, and the
    engine, which runs their rows, only after them."""
    flags = ["--workers", "2", "--grpc-port", "0", "--max-queue-delay-ms", "0"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        ready_fronts(server, poll)
        answers: list[int] = []

        def client() -> None:
            for _ in range(200):
                try:
                    status, _, _ = request(
                        server.port, "POST", "/classify", cifar_images[1], {"Content-Type": "image/jpeg"}
                    )
                except OSError:  # the port closed: the drain has begun
                    return
                answers.append(status)

        thread = threading.Thread(target=client)
        thread.start()
        poll(lambda: len(answers) >= 5, timeout=60)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0, server.log_tail()
        thread.join(timeout=60)
        assert set(answers) <= {200, 503}, Counter(answers)
        # One log file, appended by every process: its order is theirs.
        log = server.log_tail(40000)
        assert log.count("Application shutdown complete") == 2
        assert log.rindex("Application shutdown complete") < log.index("drained and closed")


def test_a_stopped_engine_is_replaced_and_its_rows_end_at_their_deadline(
    repository: Path, tmp_path: Path, cifar_images, poll
) -> None:
    """SIGSTOP, as a hang would leave the engine: a request ends at its deadline (the front-end
    keeps it too), the supervisor kills the engine that stopped reporting and starts another, and
    requests are answered again."""
    flags = ["--workers", "2", "--grpc-port", "0", "--request-timeout-s", "2"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        ready_fronts(server, poll)
        engine = engine_of(server.pid)
        assert engine is not None
        engine.send_signal(signal.SIGSTOP)
        try:
            status, _, body = request(
                server.port, "POST", "/classify", cifar_images[0], {"Content-Type": "image/jpeg"}
            )
            assert json.loads(body)["error"]["code"] == "timeout", (status, body)
            poll(lambda: (e := engine_of(server.pid)) is not None and e.pid != engine.pid, timeout=90)

            def answered() -> bool:
                headers = {"Content-Type": "image/jpeg"}
                return request(server.port, "POST", "/classify", cifar_images[0], headers)[0] == 200

            poll(answered, timeout=90)
            assert "the engine (pid" in server.log_tail(
                40000
            ) and "showed no sign of life" in server.log_tail(40000)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                engine.kill()
