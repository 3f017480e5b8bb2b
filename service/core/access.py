"""The access rule: the one table that says which scope a request needs, by HTTP path and gRPC method.

Scopes: `infer` (tasks, Hugging Face API, v2 inference, metadata, configuration, statistics),
`admin` (the model repository API and any control route), `metrics` (the Prometheus endpoint).
`None` means open: health probes (so orchestrators need no key) and the static pages (the
playground, the API documents). Admin routes are refused unless an admin key is configured, even
when no keys at all are, so that an unconfigured server cannot be reconfigured by whoever reaches
its port. Both transports ask `http_scope` / `grpc_scope`, and `service.core.keys.KeyStore`
decides with the keys it holds.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Scope(StrEnum):
    """What an API key may do; a key holds one or more."""

    INFER = "infer"
    ADMIN = "admin"
    METRICS = "metrics"


# Open HTTP paths: health probes and the static pages.
OPEN_PATHS = frozenset(
    {
        "/health/live",
        "/health/ready",
        "/v2/health/live",
        "/v2/health/ready",
        "/",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
        "/favicon.ico",
    }
)
OPEN_PREFIXES = ("/ui/",)
# A model's readiness probe, with or without a version.
MODEL_READY = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/ready$")
ADMIN_PREFIXES = ("/v2/repository",)
METRICS_PATHS = frozenset({"/metrics"})

# gRPC methods (the last part of `/inference.GRPCInferenceService/NAME`).
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
ADMIN_METHODS = frozenset({"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"})


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def http_scope(path: str) -> Scope | None:
    """The scope an HTTP request for `path` (without the root path) needs; None when it is open."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or path == "/ui" or MODEL_READY.match(path):
        return None
    if any(_under(path, prefix) for prefix in ADMIN_PREFIXES):
        return Scope.ADMIN
    if path in METRICS_PATHS:
        return Scope.METRICS
    return Scope.INFER


def grpc_scope(method: str) -> Scope | None:
    """The scope a gRPC call needs, by full (`/package.Service/Name`) or bare method name."""
    name = method.rsplit("/", 1)[-1]
    if name in OPEN_METHODS:
        return None
    if name in ADMIN_METHODS:
        return Scope.ADMIN
    return Scope.INFER


__all__ = ["Scope", "http_scope", "grpc_scope"]
