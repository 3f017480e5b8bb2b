"""`gmlp serve --server granian`: the same app behind Granian, a Rust HTTP server (ASGI interface),
instead of uvicorn. Experimental, in the `granian` extra (docs/service.md, "Granian").

Granian runs the app in a worker process that it starts itself, from an import string, so the
settings cannot be handed over as an object: they travel in the worker's environment, as the
`GMLP_*` variables `ServiceSettings` reads, and the worker builds the app with `worker_app()`.
One worker: the models, the batchers and the gRPC server live in one process, as under uvicorn.

What holds and what does not (docs/service.md, "Granian (experimental)", from the service suite
run under Granian): the app's own guarantees hold unchanged (error bodies, the header and body
limits, disconnect detection, the drain on SIGTERM through the lifespan, within Granian's worker
kill timeout). Granian's options carry what they can: the header read deadline
(`header_timeout_s`, also the idle keep-alive limit), TLS 1.2 and 1.3 with the same files. What it
cannot keep: beyond `max_connections` its backpressure makes requests wait instead of answering
503 at once; a client too slow with its headers is disconnected without the 408 body; the HTTPS
certificate is read once (gRPC's is still re-read in place).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from service.settings import ServiceSettings

log = logging.getLogger(__name__)

# The factory Granian's worker imports and calls (an import string, as Granian takes it).
TARGET = "service.granian_server:worker_app"


def settings_environment(settings: ServiceSettings) -> dict[str, str]:
    """Every setting as the `GMLP_*` variable that sets it (empty for None, as `ServiceSettings`
    reads an empty variable)."""
    env: dict[str, str] = {}
    for name in ServiceSettings.model_fields:
        value = getattr(settings, name)
        if isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = "" if value is None else str(value)
        env[f"GMLP_{name.upper()}"] = text
    return env


def worker_app() -> Any:
    """The app of a Granian worker, from the settings its environment carries."""
    from service.app import create_app

    return create_app(ServiceSettings())


def granian_options(settings: ServiceSettings) -> dict[str, Any]:
    """Granian's options that carry the service's settings (shared with the test harness, which
    runs the same app under Granian's embedded server)."""
    from granian.constants import HTTPModes, Interfaces, SSLProtocols
    from granian.http import HTTP1Settings

    tls: dict[str, Any] = {}
    if settings.tls_cert is not None:
        # TLS 1.2 and 1.3, as under uvicorn (Granian's own floor is 1.3).
        tls = {
            "ssl_cert": settings.tls_cert,
            "ssl_key": settings.tls_key,
            "ssl_protocol_min": SSLProtocols.tls12,
        }
        if settings.tls_client_ca is not None:
            tls |= {"ssl_ca": settings.tls_client_ca, "ssl_client_verify": True}
    return {
        "address": settings.host,
        "port": settings.port,
        "interface": Interfaces.ASGI,  # with the lifespan: models, gRPC and the drain run in it
        "http": HTTPModes.http1,
        "websockets": False,
        "backpressure": settings.max_connections,
        "http1_settings": HTTP1Settings(
            header_read_timeout=int(1000 * settings.header_timeout_s),
            keep_alive=True,
            # Granian's own buffer limit stays above ours, so that the app answers 431 itself.
            max_buffer_size=max(settings.max_header_bytes * 2, HTTP1Settings.max_buffer_size),
        ),
        "log_level": settings.log_level,
        "log_access": False,
        **tls,
    }


def serve_granian(settings: ServiceSettings) -> None:
    """Run the service under Granian in the foreground until SIGINT/SIGTERM (then drain and exit)."""
    try:
        from granian.server import Server
    except ImportError as exc:
        from contract.errors import UserError

        raise UserError(
            f"--server granian needs Granian: pip install 'gmlp-serve[granian]' ({exc})"
        ) from None
    os.environ.update(settings_environment(settings))
    server = Server(
        TARGET,
        factory=True,
        workers=1,
        # In-flight requests get their full deadline to finish on shutdown, then some slack.
        workers_kill_timeout=int(settings.request_timeout_s + settings.drain_timeout_s) + 1,
        **granian_options(settings),
    )
    log.warning(
        "serving under Granian (experimental) on %s:%s: over max_connections=%d requests wait instead "
        "of a 503; late headers close the connection without a 408; HTTPS files are not re-read",
        settings.host,
        settings.port,
        settings.max_connections,
    )
    server.serve()


__all__ = ["TARGET", "granian_options", "serve_granian", "settings_environment", "worker_app"]
