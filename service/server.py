"""Running the service: uvicorn in this process, or a supervisor, an engine and `workers` front-ends.

One process has one event loop, and with a small model that loop (HTTP parsing, routing, the JSON
answer) costs about as much CPU as the model's share of a batch. With `workers` > 1 the supervisor
(`Supervisor`, the process started) spawns, fresh (no state forked), one engine process
(`service.processes.engine`: every model, its batcher and sessions) and `workers` front-end
processes, each the whole HTTP and gRPC service (`service.app`) over the engine's models
(`service.processes.front`), listening on its own socket of the same ports with SO_REUSEPORT, so
that the kernel spreads connections among them. Each child is handed its place as a `Topology`.
The supervisor serves nothing. It holds both ports bound but not listening (so that port 0
resolves once and no other program can take them, while no connection is queued to a socket nobody
accepts on), restarts a child that dies, has the front-ends and then the engine drain on SIGTERM
and SIGINT, forwards SIGHUP (keys and TLS re-read) to the front-ends, and serves `metrics_port`
from every child's series (prometheus_client's multiprocess mode, in the server's private folder,
beside the engine's socket). A child whose supervisor ends, even by
SIGKILL, is sent SIGTERM by the kernel and drains too (`_end_with`); one that stops reporting is
killed and replaced (`Supervisor._kill_hung`).

A front-end is given its share of the connection caps (`worker_settings`), so that the server's
limits stay what the settings say; the engine every CPU (`engine_settings`). Before anything
starts, the caps are fitted to the process's file descriptor limit
(`service.descriptors.fit_connection_caps`), so that a cap is reached before the descriptors run
out.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

from contract.errors import UserError
from service.descriptors import fit_connection_caps, share
from service.processes.topology import Role, Topology, WorkerLink, private_folder
from service.settings import ServiceSettings
from service.telemetry.logs import configure_logging, uvicorn_log_config

log = logging.getLogger(__name__)

# A worker that ends before it has loaded its models, this many times in a row, is not restarted
# again: something in its start-up is broken, and the supervisor stops (exit status 1) instead of
# looping. Deaths of workers that had loaded (a poison request, the OOM killer) are only restarted.
EARLY_EXITS = 5
# A loaded worker whose event loop has not turned for this long is taken to hang (it reports every
# `service.processes.topology.BEAT_S`): killed and replaced.
HUNG_S = 10.0
# A worker's exit status when the settings cannot work (unreadable TLS or keys files): no restart.
CONFIGURATION_ERROR = 2
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def serve(settings: ServiceSettings) -> None:
    """Serve until SIGINT/SIGTERM (then drain and exit): in this process, or with workers."""
    # The number of front-ends fixed here, from this process's CPUs: a child's are its share.
    settings = fit_connection_caps(settings.model_copy(update={"workers": settings.resolved_workers()}))
    if settings.resolved_workers() == 1:
        _run_uvicorn(settings, sockets=None)
    elif (status := Supervisor(settings).run()) != 0:
        raise SystemExit(status)


def _run_uvicorn(
    settings: ServiceSettings,
    sockets: list[socket.socket] | None,
    worker: WorkerLink | None = None,
    topology: Topology | None = None,
) -> bool:
    """The app on uvicorn until it is stopped; False when it never started."""
    import uvicorn

    from service.app import create_app

    app = create_app(settings, worker=worker, topology=topology)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(settings),
        # The service writes its own access line (service.http.observe), in the log format.
        access_log=False,
        **server_options(settings, app),
    )
    server = uvicorn.Server(config)
    server.run(sockets=sockets)
    return server.started


def server_options(settings: ServiceSettings, app: Any = None) -> dict[str, Any]:
    """uvicorn's options that enforce the service's settings (shared with the test harness); with
    the `app`, also its TLS context (`app.state.tls`, re-read in place when the files change)."""
    # These import uvicorn: not for `gmlp --help`.
    from service.http.admission import tls_protocol
    from service.http.connections import http_protocol

    http = http_protocol(settings.header_timeout_s, send_timeout_s=settings.send_timeout_s)
    tls = getattr(getattr(app, "state", None), "tls", None)
    if tls is not None:
        # TLS is the protocol's own (uvicorn listens in plain TCP), so that a connection is counted
        # against the cap from accept and its handshake bounded by header_timeout_s.
        http = tls_protocol(http, tls.context, settings.header_timeout_s)
    return {
        # In-flight requests get their full deadline to finish on shutdown, then some slack.
        "timeout_graceful_shutdown": _graceful_s(settings),
        # Beyond this many connections (counted from accept, idle keep-alive ones evicted first) or
        # in-flight requests a newcomer is refused at once, so idle or slow clients cannot exhaust
        # file descriptors or memory; the protocol is ours so that the refusal is a 503 in the REST
        # error shape, with Retry-After, and counted (service.http.admission, .connections).
        "limit_concurrency": settings.max_connections,
        # Slow clients: TLS handshake and headers each within header_timeout_s (408 and closed, as
        # the protocol enforces), idle kept-alive connections closed after keep_alive_timeout_s,
        # answers the client does not read dropped after send_timeout_s (service.http.connections).
        "http": http,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
    }


def _graceful_s(settings: ServiceSettings) -> int:
    return int(settings.request_timeout_s + settings.drain_timeout_s) + 1


def worker_settings(settings: ServiceSettings, port: int) -> ServiceSettings:
    """One front-end's settings: the resolved `port`; its share of the CPUs (its decoding threads)
    and of the HTTP and gRPC connection caps; no metrics port (the supervisor serves it)."""
    n = settings.resolved_workers()
    return settings.model_copy(
        update={
            "port": port,
            "cpus": max(1, settings.usable_cpus() // n),
            "max_connections": share(settings.max_connections, n),
            "grpc_max_connections": share(settings.grpc_max_connections, n),
            "metrics_port": None,
        }
    )


def engine_settings(settings: ServiceSettings) -> ServiceSettings:
    """The engine's settings: every CPU of the server for the sessions, no port of its own."""
    return settings.model_copy(update={"cpus": settings.usable_cpus(), "metrics_port": None})


def _unclaimed(host: str, port: int) -> None:
    """OSError (EADDRINUSE) where a socket of another process listens on (host, port) already.

    The front-ends' sockets share the port with SO_REUSEPORT, which would as well let them join a
    group that another process of the same user made with it (a server left running, an orphan of
    one that was killed): the kernel would then hand that process part of the new server's
    connections. A socket without SO_REUSEPORT cannot join any group, so binding one first, and
    closing it again, tells whether the port is free."""
    if port == 0:
        return
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a connection in TIME_WAIT is no owner
        probe.bind((host, port))
    finally:
        probe.close()


def _socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) in the port's SO_REUSEPORT group."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _end_with(supervisor: int) -> None:
    """Have the kernel send this worker SIGTERM when its supervisor ends, however it ends (SIGKILL,
    the OOM killer): the worker then drains and closes its sockets instead of serving on, with
    nobody to stop it, the models and settings of a server that is gone (and the port with them).
    A supervisor that ended before the call is seen by its pid. Linux only (prctl)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:
        raise SystemExit(CONFIGURATION_ERROR)


def _front(settings: ServiceSettings, topology: Topology, supervisor: int, link: WorkerLink) -> None:
    """A front-end process's body: the whole service on its own socket of the port, its models the
    engine's, listening once the engine's models are loaded (and reporting through `link` from then
    on). A connection the kernel gives a front-end stays there, so one still waiting must not take
    any: it would answer not_ready while another could serve (the probes see the port closed until
    the first front-end is ready, which the start-up probes of deploy/ allow for)."""
    _end_with(supervisor)
    topology.keep_metrics()
    configure_logging(settings)
    sock = _socket(settings.host, settings.port)  # asyncio listens on it when uvicorn starts serving
    log.info("%s (pid %d) serving on port %d", topology.name, os.getpid(), settings.port)
    try:
        started = _run_uvicorn(settings, [sock], worker=link, topology=topology)
    except UserError as exc:
        log.error("%s cannot start: %s", topology.name, exc)
        raise SystemExit(CONFIGURATION_ERROR) from None
    if not started:
        raise SystemExit(3)


def _engine(settings: ServiceSettings, topology: Topology, supervisor: int, link: WorkerLink) -> None:
    """The engine process's body (`service.processes.engine`)."""
    import asyncio

    topology.keep_metrics()  # before prometheus_client is imported

    from service.lifecycle.state import ServiceState
    from service.processes.engine import run_engine
    from service.telemetry.metrics import ServiceMetrics

    _end_with(supervisor)
    configure_logging(settings)
    log.info("engine (pid %d) for %d front-ends", os.getpid(), topology.fronts)
    state = ServiceState(settings, ServiceMetrics(settings.max_batch_size))
    asyncio.run(run_engine(state, topology, link.report))


class Supervisor:
    """The parent of the engine and the front-ends: starts them, restarts one that dies or hangs,
    stops them all on a signal (the front-ends first, so that the engine finishes their rows)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.context = multiprocessing.get_context("spawn")
        self.children: dict[str, BaseProcess] = {}
        self.links: dict[str, WorkerLink] = {}  # what each child reports
        self.early: dict[str, int] = {}  # each child's exits in a row before it had loaded
        self.stopping = False

    def run(self) -> int:
        """Serve until a signal stops every child: 0, or 1 when a child kept failing at start."""
        settings = self.settings
        reserved: list[socket.socket] = []
        for wanted in (settings.port, settings.grpc_port) if settings.grpc_port else (settings.port,):
            try:
                _unclaimed(settings.host, wanted)
                reserved.append(_socket(settings.host, wanted))
            except OSError as exc:
                for sock in reserved:
                    sock.close()
                raise UserError(f"cannot listen on {settings.host}:{wanted}: {exc.strerror}") from None
        port = reserved[0].getsockname()[1]
        shared = Path(tempfile.mkdtemp(prefix="gmlp-workers-"))  # private: mode 0700
        self.metrics_dir = metrics_dir = shared / "metrics"
        metrics_dir.mkdir(mode=0o700)
        self.topology = Topology(
            Role.ENGINE,
            0,
            settings.resolved_workers(),
            shared,
            secrets.token_bytes(32),
            settings.usable_cpus(),
            f"gmlp-{secrets.token_hex(6)}",
        )
        self.front_settings = worker_settings(settings, port)
        self.engine_settings = engine_settings(settings)
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        handlers = {sig: signal.signal(sig, self._signal) for sig in signals}
        metrics_server = None
        try:
            if settings.metrics_port:
                from service.app import start_metrics_port
                from service.telemetry.metrics import server_registry

                metrics_server = start_metrics_port(settings, server_registry(str(metrics_dir)))
            log.info("starting an engine and %d front-ends on port %d", settings.resolved_workers(), port)
            for name in ("engine", *(f"front-end {i}" for i in range(settings.resolved_workers()))):
                if not self.stopping:  # a signal during the start reaches only those started
                    self._start(name)
            return self._supervise()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for process in self.children.values():  # still alive only after an early failure
                process.kill()
                process.join()
            if metrics_server is not None:
                metrics_server.shutdown()
            for sock in reserved:
                sock.close()
            shutil.rmtree(shared, ignore_errors=True)

    def _start(self, name: str) -> None:
        # A /tmp cleaner may have removed the shared folder since the last start: made again, so
        # that a restarted child finds where its series and the engine's socket go.
        for folder in (self.metrics_dir.parent, self.metrics_dir):
            private_folder(folder)
        link = WorkerLink(self.context.Event(), self.context.Value("d", 0.0, lock=False))
        if name == "engine":
            target: Any = _engine
            args: tuple[Any, ...] = (self.engine_settings, self.topology)
        else:
            target = _front
            args = (self.front_settings, self.topology.as_front(int(name.rsplit(" ", 1)[1])))
        process = self.context.Process(
            target=target, args=(*args, os.getpid(), link), name=f"gmlp-{name.replace(' ', '-')}"
        )
        process.start()
        self.children[name], self.links[name] = process, link

    def _supervise(self) -> int:
        from prometheus_client.multiprocess import mark_process_dead

        from service.telemetry.metrics import fold_dead_process

        deadline: float | None = None
        engine_told = False
        while self.children:
            if self.stopping and deadline is None:
                deadline = time.monotonic() + 2 * _graceful_s(self.settings) + 5
            if self.stopping and not engine_told and list(self.children) == ["engine"]:
                self._forward("engine", signal.SIGTERM)  # the front-ends have drained: the engine's turn
                engine_told = True
            timeout = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            ended = wait([p.sentinel for p in self.children.values()], timeout=timeout)
            if deadline is not None and not ended and time.monotonic() >= deadline:
                log.warning("processes still running after the drain: killed")
                for process in self.children.values():
                    process.kill()
            if not self.stopping:
                self._kill_hung()
            for name, process in list(self.children.items()):
                if process.is_alive():
                    continue
                process.join()
                del self.children[name]
                if process.pid is not None:  # its live gauges go, its counts are folded in
                    mark_process_dead(process.pid, str(self.metrics_dir))
                    fold_dead_process(self.metrics_dir, process.pid)
                if self.stopping:
                    continue
                if process.exitcode == CONFIGURATION_ERROR:
                    return 1
                self.early[name] = 0 if self.links[name].loaded.is_set() else self.early.get(name, 0) + 1
                if self.early[name] >= EARLY_EXITS:
                    log.error(
                        "the %s keeps ending before it has loaded (last exit status %s): stopping",
                        name,
                        process.exitcode,
                    )
                    return 1
                log.warning("the %s ended with status %s: restarting", name, process.exitcode)
                self._start(name)
        return 0

    def _kill_hung(self) -> None:
        """Kill each loaded child whose event loop has not turned for `HUNG_S` (stopped, or stuck
        in a deadlock or an endless call): a front-end holds its socket of the port, so the kernel
        would go on handing it new connections that nobody answers; an engine would hold every
        row. Its exit is then a restart."""
        now = time.monotonic()
        for name, process in self.children.items():
            link = self.links[name]
            if link.loaded.is_set() and process.is_alive() and now - link.beat.value > HUNG_S:
                log.error(
                    "the %s (pid %s) showed no sign of life for %g s: killed", name, process.pid, HUNG_S
                )
                process.kill()

    def _forward(self, name: str, signum: int) -> None:
        process = self.children.get(name)
        if process is not None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGHUP:
            self.stopping = True
        forwarded = signal.SIGHUP if signum == signal.SIGHUP else signal.SIGTERM
        for name in self.children:
            if name != "engine":  # the engine drains once the front-ends have (`_supervise`)
                self._forward(name, forwarded)
