"""The access rule: the scopes a key may hold, and which scope each gRPC method needs.

Scopes: `infer` (tasks, Hugging Face API, v2 inference, metadata, configuration, statistics),
`admin` (the model repository API and any control route), `metrics` (the Prometheus endpoint).
`None` means open: health probes (so orchestrators need no key) and the static pages (the
playground, the API documents). Admin routes are refused unless an admin key is configured, even
when no keys at all are, so that an unconfigured server cannot be reconfigured by whoever reaches
its port. An HTTP route declares its scope where it is declared (`service.http.routing`), gRPC
methods are named here (`grpc_scope`); `service.access.keys.KeyStore` decides with the keys it holds.
"""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    """What an API key may do; a key holds one or more."""

    INFER = "infer"
    ADMIN = "admin"
    METRICS = "metrics"


# gRPC methods (the last part of `/inference.GRPCInferenceService/NAME`).
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
ADMIN_METHODS = frozenset({"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"})


def grpc_scope(method: str) -> Scope | None:
    """The scope a gRPC call needs, by full (`/package.Service/Name`) or bare method name."""
    name = method.rsplit("/", 1)[-1]
    if name in OPEN_METHODS:
        return None
    if name in ADMIN_METHODS:
        return Scope.ADMIN
    return Scope.INFER
