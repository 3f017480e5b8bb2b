"""Access control and connection limits of the gRPC server: API keys, TLS, slow and idle clients.

The key comes as the `authorization` metadata (`Bearer KEY`, what tritonclient sends from its
`headers`) or as `x-api-key`; the scope a method needs is the one table's (`service.access.scope`).
A refused call never reaches the servicer (`service.v2.grpc_calls`): UNAUTHENTICATED, PERMISSION_DENIED, or
RESOURCE_EXHAUSTED with a `retry-after` trailer over the key's rate, each with the message REST
clients read. TLS comes from the same files as HTTPS (`service.access.tls`), re-read when they
change: gRPC asks for the current certificate at each new connection's handshake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from service.access.keys import presented_key
from service.access.tls import TlsFiles
from service.settings import ServiceSettings


def metadata_credential(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The key in a call's metadata (`presented_key`); binary metadata is never a key."""
    return presented_key((name, value) for name, value in metadata or () if isinstance(value, str))


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """TLS credentials that take the current certificate at each handshake (TLS 1.2+, gRPC's
    default strong suites); a client certificate is required when a client CA is configured."""

    def configuration() -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(tls.pem.key, tls.pem.cert)], root_certificates=tls.pem.client_ca
        )

    served = tls.generation

    def fetch() -> Any:
        nonlocal served
        if tls.generation == served:
            return None
        served = tls.generation
        return configuration()

    return grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=tls.mutual
    )


def connection_options(settings: ServiceSettings) -> list[tuple[str, Any]]:
    """The server's limits on connections: message size, keepalive pings (a client may ping at most
    every 60 s without calls; abusers are disconnected), idle and maximum age (clients reconnect,
    which also spreads them over replicas), the handshake's deadline, and the number of open
    connections: gRPC core counts each from accept until it closes and closes one over
    `grpc_max_connections` at once, before its handshake (what bounds descriptors: an HTTP/2
    stream limit would not)."""
    ms = 1000
    return [
        ("grpc.max_receive_message_length", settings.max_upload_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 60 * ms),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.max_connection_idle_ms", int(settings.grpc_max_connection_idle_s * ms)),
        ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * ms)),
        ("grpc.max_connection_age_grace_ms", int(settings.drain_timeout_s * ms)),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * ms)),
        ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
    ]


__all__ = ["metadata_credential", "server_credentials", "connection_options"]
