"""The gRPC port's limits: what one connection, its streams, metadata and pings may take, and how
many connections; gRPC core enforces them (docs/security.md, "HTTP/2 floods")."""

from __future__ import annotations

from typing import Any

from service.settings import ServiceSettings

# HTTP/2 limits of the port (what floods of frames get: docs/security.md, "HTTP/2 floods"). Calls
# in flight per connection, RFC 9113's floor; with gRPC core's overload protection a reset stream
# counts until its call is finished, which holds a rapid reset (CVE-2023-44487) to that many.
GRPC_MAX_STREAMS = 100
# Calls not yet taken by the loop, per method: over the first a growing share of new calls of the
# method is refused at once (CANCELLED), over the second all are. A rapid reset without the stream
# limit fills it with its cancelled calls, and every client's calls of the method fail. With the
# limit a connection holds at most GRPC_MAX_STREAMS of them, so the first is set for 40 connections
# of reset streams (gRPC core's 1,000 let 16 of them, on a loaded machine, refuse others' calls).
GRPC_PENDING_CALLS = (40 * GRPC_MAX_STREAMS, 80 * GRPC_MAX_STREAMS)


def connection_options(settings: ServiceSettings) -> list[tuple[str, Any]]:
    """The server's limits on connections: message size, HTTP/2's (streams, metadata, pings),
    idle and maximum age (clients reconnect, which also spreads them over replicas), the
    handshake's deadline, and the number of open connections: gRPC core counts each from accept
    until it closes and closes one over `grpc_max_connections` at once, before its handshake (what
    bounds descriptors: an HTTP/2 stream limit would not); the port shared only among workers."""
    ms = 1000
    return [
        ("grpc.max_receive_message_length", settings.max_upload_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_concurrent_streams", GRPC_MAX_STREAMS),
        ("grpc.http.overload_protection", 1),  # gRPC core's default, and what makes the limit hold
        ("grpc.server.max_pending_requests", GRPC_PENDING_CALLS[0]),
        ("grpc.server.max_pending_requests_hard_limit", GRPC_PENDING_CALLS[1]),
        # Metadata as HTTP's request head, one limit (soft = hard: none under it is refused at
        # random). A header block over it is decoded and dropped as it arrives, never kept, and
        # its call refused: endless CONTINUATION frames cost the server no memory.
        ("grpc.max_metadata_size", settings.max_header_bytes),
        ("grpc.absolute_max_metadata_size", settings.max_header_bytes),
        # With calls in flight a ping per 60 s without data, without calls one per 2 h (gRPC
        # core's); the third ping sooner gets a GOAWAY.
        ("grpc.http2.min_ping_interval_without_data_ms", 60 * ms),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.max_connection_idle_ms", int(settings.grpc_max_connection_idle_s * ms)),
        ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * ms)),
        ("grpc.max_connection_age_grace_ms", int(settings.drain_timeout_s * ms)),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * ms)),
        ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
        # Workers share the port (service.server); a lone server refuses a port another one holds.
        ("grpc.so_reuseport", int(settings.resolved_workers() > 1)),
    ]
