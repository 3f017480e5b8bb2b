"""Worker processes (`workers` > 1): real `gmlp serve` processes, their sockets read from the kernel.

The supervisor must leave both ports to its workers (each listening on its own socket of the
port), replace a worker that dies, drain them all on SIGTERM, and stop at once when a worker cannot
start; each worker must hold its share of the caps.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import pickle
import shutil
import signal
import socket
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from gmlp.server_process import ServerProcess, free_port, gmlp_serve, serve_argv
from service.server import engine_settings, worker_settings
from support.endless_graph import endless_warm_up
from support.keys import bearer, write_keys
from support.process_tree import (
    children_of,
    engine_of,
    established_on,
    listening_ports,
    private_folder_of,
    workers_of,
)


def test_a_front_end_gets_its_share_of_the_caps_and_the_engine_every_cpu(make_settings) -> None:
    settings = make_settings(
        workers=3,
        cpus=12,
        intra_op_threads=None,
        max_connections=1000,
        grpc_max_connections=10,
        max_queue_size=256,
        metrics_port=9100,
    )
    child = worker_settings(settings, 4321)
    assert (child.port, child.metrics_port, child.workers) == (4321, None, 3)
    assert child.max_connections == math.ceil(1000 / 3)
    assert child.grpc_max_connections == math.ceil(10 / 3)
    assert child.cpus == 4  # its decoding threads
    # The engine holds every model's one queue and runs every session: the whole of both.
    engine = pickle.loads(pickle.dumps(engine_settings(settings)))
    assert (engine.max_queue_size, engine.max_batch_size, engine.metrics_port) == (
        256,
        settings.max_batch_size,
        None,
    )
    instances = engine.resolved_instances("cpu")
    assert (engine.usable_cpus(), instances, engine.resolved_threads(instances)) == (12, 2, 6)
    assert engine.resolved_lone_threads("cpu") == 12


@pytest.mark.parametrize("bad", [0, 65, "2.5", "two", -1])
def test_a_worker_count_outside_1_to_64_is_refused(make_settings, bad: object) -> None:
    with pytest.raises(ValidationError, match="workers"):
        make_settings(workers=bad)


@pytest.fixture
def two_workers(repository: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    grpc_port = free_port()
    flags = ["--workers", "2", "--grpc-port", str(grpc_port), "--intra-op-threads", "1"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        yield server, grpc_port


def classify(connection: http.client.HTTPConnection, image: bytes) -> dict:
    connection.request("POST", "/classify", body=image, headers={"Content-Type": "image/jpeg"})
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200, body
    return json.loads(body)


def classify_on_new_connections(port: int, image: bytes, count: int) -> None:
    """`count` requests, each on a connection of its own (the kernel spreads new connections over
    the workers), every one answered."""
    for _ in range(count):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            classify(connection, image)
        finally:
            connection.close()


def test_workers_listen_on_both_ports_and_share_the_connections(two_workers, cifar_images, poll) -> None:
    server, grpc_port = two_workers
    poll(
        lambda: (
            len(workers_of(server.pid)) == 2
            and all(listening_ports(w) >= {server.port, grpc_port} for w in workers_of(server.pid))
        ),
        timeout=60,
    )
    # The supervisor holds the ports bound, never listening: no connection waits on its socket.
    assert not listening_ports(psutil.Process(server.pid)) & {server.port, grpc_port}
    connections = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=30) for _ in range(24)]
    try:
        answers = [classify(c, cifar_images[0]) for c in connections]
        # Every worker serves the same model: one image, one answer, whichever worker took it.
        assert all(a["predictions"] == answers[0]["predictions"] for a in answers)
        per_worker = [established_on(w, server.port) for w in workers_of(server.pid)]
        assert sum(per_worker) == len(connections)
        assert min(per_worker) >= 1, per_worker  # the kernel spread them (2 ** -23 that it did not)
    finally:
        for c in connections:
            c.close()


def test_a_dead_worker_is_replaced_and_sigterm_drains_every_worker(two_workers, cifar_images, poll) -> None:
    server, _ = two_workers
    poll(lambda: len(workers_of(server.pid)) == 2, timeout=60)
    first, second = workers_of(server.pid)
    metrics_dir = private_folder_of(server.pid) / "metrics"
    assert metrics_dir.is_dir()
    first.send_signal(signal.SIGKILL)
    poll(lambda: {w.pid for w in workers_of(server.pid)} - {first.pid, second.pid} != set(), timeout=60)
    replacement = next(w for w in workers_of(server.pid) if w.pid not in (first.pid, second.pid))
    poll(lambda: server.port in listening_ports(replacement), timeout=60)
    classify_on_new_connections(server.port, cifar_images[1], 8)
    assert server.proc is not None
    os.kill(server.pid, signal.SIGTERM)  # the supervisor alone: it forwards the signal
    assert server.proc.wait(timeout=90) == 0, server.log_tail()
    assert not second.is_running() and not replacement.is_running()
    assert not metrics_dir.exists()
    assert server.log_tail(20000).count("Application shutdown complete") == 2


def test_workers_end_when_their_supervisor_is_killed(repository: Path, tmp_path: Path, poll) -> None:
    """SIGKILL (as the OOM killer sends it) reaches the supervisor alone; its workers are then sent
    SIGTERM by the kernel, drain and exit, and the port closes: no orphan serves on."""
    flags = ["--workers", "2", "--grpc-port", "0", "--intra-op-threads", "1"]
    flags += ["--request-timeout-s", "5", "--drain-timeout-s", "2"]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        poll(lambda: len(workers_of(server.pid)) == 2 and engine_of(server.pid) is not None, timeout=60)
        workers = children_of(server.pid)
        assert len(workers) == 3
        try:
            os.kill(server.pid, signal.SIGKILL)
            poll(
                lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
                timeout=60,
            )
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        finally:
            for worker in workers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()


def test_front_ends_still_starting_end_when_their_supervisor_is_killed(
    tiny_vision_served: Path, tmp_path: Path, poll
) -> None:
    """The supervisor killed while the front-ends still wait for the engine's models (a load whose
    warm-up never ends holds them): the kernel's SIGTERM comes while uvicorn waits for the app's
    start, which it does not interrupt, and the front-ends end anyway."""
    repository = tmp_path / "repository"
    endless_warm_up(tiny_vision_served, repository / "endless")
    flags = ["--workers", "2", "--grpc-port", "0", "--intra-op-threads", "1"]
    server = gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags)
    server.start()  # never ready: its log says when the front-ends wait
    children: list[psutil.Process] = []
    try:
        poll(lambda: server.log_tail(20000).count("Waiting for application startup") == 2, timeout=60)
        children = children_of(server.pid)
        fronts = workers_of(server.pid)
        assert len(fronts) == 2
        os.kill(server.pid, signal.SIGKILL)
        poll(
            lambda: not any(f.is_running() and f.status() != psutil.STATUS_ZOMBIE for f in fronts),
            timeout=60,
        )
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        server.stop()


def test_loaded_workers_that_die_are_restarted_however_often(two_workers, cifar_images, poll) -> None:
    """Deaths of workers that had loaded their models (a poison request, the OOM killer) do not
    count as a broken start: more of them in a row than stop a server whose workers cannot start
    are each followed by a restart, and the server keeps serving."""
    server, _ = two_workers
    poll(lambda: len(workers_of(server.pid)) == 2, timeout=60)
    for _ in range(6):  # EARLY_EXITS is 5
        victim = next(w for w in workers_of(server.pid) if server.port in listening_ports(w))
        victim.send_signal(signal.SIGKILL)
        poll(
            lambda gone=victim.pid: (
                gone not in {w.pid for w in workers_of(server.pid)}
                and sum(server.port in listening_ports(w) for w in workers_of(server.pid)) == 2
            ),
            timeout=60,
        )
    assert server.proc is not None and server.proc.poll() is None, server.log_tail()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        classify(connection, cifar_images[0])
    finally:
        connection.close()


def test_a_worker_restarts_after_a_cleaner_removed_the_shared_folder(two_workers, cifar_images, poll) -> None:
    """The supervisor's private folder (each worker's metric files, the key buckets) removed, as a
    /tmp cleaner would, then a worker dies: the folder is made again, private, before its
    replacement starts, which loads and serves."""
    server, _ = two_workers
    poll(lambda: len(workers_of(server.pid)) == 2, timeout=60)
    first, second = workers_of(server.pid)
    metrics_dir = private_folder_of(server.pid) / "metrics"
    shutil.rmtree(metrics_dir.parent)
    first.send_signal(signal.SIGKILL)
    poll(
        lambda: any(
            w.pid not in (first.pid, second.pid) and server.port in listening_ports(w)
            for w in workers_of(server.pid)
        ),
        timeout=60,
    )
    assert server.proc is not None and server.proc.poll() is None, server.log_tail()
    assert metrics_dir.is_dir() and stat.S_IMODE(metrics_dir.parent.stat().st_mode) == 0o700
    classify_on_new_connections(server.port, cifar_images[0], 4)


def test_the_private_folder_is_made_again_only_where_nothing_else_stands(tmp_path: Path) -> None:
    """Missing: made, mode 0700. A link someone put where a removed folder was, or a folder that
    others may enter, is refused rather than used for the workers' files."""
    from contract.errors import UserError
    from service.processes.topology import private_folder as _private_folder

    made = tmp_path / "made"
    _private_folder(made)
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o700
    _private_folder(made)  # already there, as it should be: kept
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(elsewhere)
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o755)
    for refused in (tmp_path / "link", opened):
        with pytest.raises(UserError, match="not this server's private folder"):
            _private_folder(refused)


def test_a_stopped_worker_is_killed_and_replaced(two_workers, cifar_images, poll) -> None:
    """SIGSTOP, as a hang would leave it: the worker's event loop stops reporting, so the
    supervisor kills it (a stopped worker would go on being handed new connections that nobody
    answers) and starts another, and every new connection is answered again."""
    server, _ = two_workers
    poll(lambda: sum(server.port in listening_ports(w) for w in workers_of(server.pid)) == 2, timeout=60)
    stopped, other = workers_of(server.pid)
    stopped.send_signal(signal.SIGSTOP)
    try:
        poll(
            lambda: any(
                w.pid not in (stopped.pid, other.pid) and server.port in listening_ports(w)
                for w in workers_of(server.pid)
            ),
            timeout=90,
        )
        assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE
        assert "showed no sign of life" in server.log_tail(20000)
        classify_on_new_connections(server.port, cifar_images[0], 8)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            stopped.kill()


def test_a_worker_that_cannot_start_stops_the_server(repository: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    argv = serve_argv(
        repository, free_port(), "--workers", "2", "--tls-cert", str(missing), "--tls-key", str(missing)
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "cannot start: GMLP_TLS_CERT" in done.stderr and "No such file" in done.stderr
    assert done.stderr.count("Traceback") == 0


@pytest.mark.parametrize(
    ("which", "group"),
    [("http", False), ("http", True), ("grpc", True)],
    ids=["http", "http-reuseport-group", "grpc-reuseport-group"],
)
def test_a_taken_port_is_refused_before_any_worker_starts(repository: Path, which: str, group: bool) -> None:
    """Also where the socket holding it is in an SO_REUSEPORT group of this user's, which the
    front-ends' sockets could otherwise join and then share the connections with."""
    with socket.socket() as taken:
        if group:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        http_port, flags = (port, []) if which == "http" else (free_port(), ["--grpc-port", str(port)])
        done = subprocess.run(
            serve_argv(repository, http_port, "--workers", "2", *flags),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "starting an engine" not in done.stderr


def test_workers_need_no_more_than_the_interpreter(repository: Path) -> None:
    """Workers are spawned, not forked: the settings travel to them pickled."""
    settings_code = (
        "import pickle; from service.settings import ServiceSettings; "
        f"s = ServiceSettings(model_repository={str(repository)!r}, workers=2, port=0); "
        "t = pickle.loads(pickle.dumps(s)); assert t == s, (s, t); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", settings_code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_server_counts_every_worker_and_sighup_reaches_them_all(
    repository: Path, tmp_path: Path, cifar_images, poll
) -> None:
    """The supervisor's metrics port and the v2 statistics of any worker count every worker's
    requests; a key's rate holds for the server, not per worker; SIGHUP to the supervisor has each
    worker re-read the keys file."""
    keys = write_keys(tmp_path / "keys", client="infer,metrics", limited="infer rate=0.001 burst=3")
    metrics_port = free_port()
    flags = ["--workers", "2", "--api-keys-file", str(tmp_path / "keys"), "--metrics-port", str(metrics_port)]
    with gmlp_serve(repository, log_path=tmp_path / "serve.log", serve_args=flags) as server:
        poll(lambda: all(server.port in listening_ports(w) for w in workers_of(server.pid)), timeout=60)
        sent = 0
        for _ in range(12):  # fresh connections: both workers take some (checked below)
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                connection.request(
                    "POST",
                    "/classify",
                    body=cifar_images[2],
                    headers={"Content-Type": "image/jpeg", **bearer(keys["client"])},
                )
                assert connection.getresponse().status == 200
                sent += 1
            finally:
                connection.close()

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
            )
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }

        classified = sum(
            v
            for (name, labels), v in scrape().items()
            if name == "gmlp_http_requests_total" and dict(labels)["route"] == "/classify"
        )
        assert classified == sent
        for _ in range(4):  # whichever worker answers, the statistics are the server's
            request = urllib.request.Request(
                f"{server.base_url}/v2/models/tiny-vision/stats", headers=bearer(keys["client"])
            )
            stats = json.loads(urllib.request.urlopen(request, timeout=10).read())["model_stats"]
            assert sum(int(s["inference_count"]) for s in stats) == sent

        statuses = []
        for _ in range(8):  # fresh connections again: a bucket per worker would let up to 6 pass
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                connection.request("GET", "/v2/models/tiny-vision", headers=bearer(keys["limited"]))
                statuses.append(connection.getresponse().status)
            finally:
                connection.close()
        assert sorted(statuses) == [200] * 3 + [429] * 5

        def reloads() -> float:
            key = ("gmlp_file_reloads_total", (("file", "api_keys"), ("result", "ok")))
            return scrape().get(key, 0.0)

        before = reloads()
        os.kill(server.pid, signal.SIGHUP)
        poll(lambda: reloads() == before + 2, timeout=30)  # one re-read in each worker
