"""API keys: the keys file, the decision for each request, per-key rate limits.

The keys file (`GMLP_API_KEYS_FILE`; docs/security.md, "The keys file") holds a line
`NAME SCOPES sha256:DIGEST [rate=R] [burst=B]` per key; `#` starts a comment. It holds digests
only, so no usable secret; a presented key is hashed and compared with every digest in constant
time (`hmac.compare_digest`). The name labels the key's metrics and log lines; the key itself
appears nowhere. The file is re-read when it changes and on SIGHUP (`service.access.watch`); a
file that does not parse keeps the keys in force, and says why in the log and in
`gmlp_file_reloads_total`.

A file rewritten in place (truncated, then written) is read half-written by a watcher that looks
at the wrong moment: empty, or with only its first lines. So the watcher applies a change at once
only when it cannot take a valid key away (the file was replaced by a new one, as `mv` and a
Secret volume do; or every key in force is still there, unchanged); a change that removes or
alters a key is applied once the file has read the same for `SETTLE_S`. And a file that reads
empty (nothing but white space) never replaces keys in force: a file meant to hold no key holds a
comment (`# no keys`). SIGHUP applies the file as it reads at that moment (the operator says it is
complete), except that rule.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from contract.errors import ErrorCode, PermissionDenied, RateLimited, Unauthenticated, UserError
from service.access.scope import Scope
from service.access.watch import Reloadable, Signature, signature
from service.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
SETTLE_S = 1.0  # how long a change that removes or alters a key must read the same before it applies
ANONYMOUS = "anonymous"  # the metrics' name for requests without a key where none is needed
INVALID = "invalid"  # ... and for requests with a key that matches none


def digest(key: str) -> str:
    """The keys file's form of `key`: `sha256:` and its hex SHA-256."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def key_line(name: str, scopes: str, key: str, *options: str) -> str:
    """The keys file's line for `key` (stored as its digest): `NAME SCOPES sha256:... [OPTIONS]`."""
    return " ".join([name, scopes, digest(key), *options])


def presented_key(fields: Iterable[tuple[str, str]]) -> str | None:
    """The key among a request's header or metadata fields (lower-case names): a Bearer
    `authorization`, else `x-api-key`; None when neither is sent."""
    api_key = None
    for name, value in fields:
        if name == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == "x-api-key" and value.strip():
            api_key = value.strip()
    return api_key


def new_key() -> str:
    """A fresh random key (256 bits)."""
    return "gmlp_" + secrets.token_urlsafe(32)


@dataclass
class TokenBucket:
    """`rate` requests per second, `burst` at once."""

    rate: float
    burst: int
    tokens: float = field(init=False)
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def take(self, now: float) -> float:
        """0 when a request may pass (and is counted), else the seconds until one may."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Rates(Protocol):
    """Where the keys' token buckets live: this process (`LocalRates`), or, in a server of several
    processes, the engine process, which every front-end asks (`service.processes.front`), so that
    a key's rate holds for the server."""

    async def take(self, name: str, rate: float, burst: int) -> float:
        """0 when a request of key `name` may pass (counted), else the seconds until one may."""
        ...


class LocalRates:
    """The buckets of this process, one per key and its limits (a changed rate or burst starts
    full). A full bucket is the same as a new one, so full ones are dropped once `LIMIT` are held."""

    LIMIT = 1024

    def __init__(self) -> None:
        self.buckets: dict[tuple[str, float, int], TokenBucket] = {}

    def take_now(self, name: str, rate: float, burst: int) -> float:
        now = time.monotonic()
        bucket = self.buckets.get((name, rate, burst))
        if bucket is None:
            if len(self.buckets) >= self.LIMIT:
                self._drop_full(now)
            bucket = self.buckets[(name, rate, burst)] = TokenBucket(rate, burst, at=now)
        return bucket.take(now)

    async def take(self, name: str, rate: float, burst: int) -> float:
        return self.take_now(name, rate, burst)

    def _drop_full(self, now: float) -> None:
        for limits, bucket in list(self.buckets.items()):
            if bucket.tokens + (now - bucket.at) * bucket.rate >= bucket.burst:
                del self.buckets[limits]


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # the raw SHA-256
    scopes: frozenset[Scope]
    rate: float | None = None
    burst: int = 1


def _options(name: str, words: list[str], where: str) -> tuple[float | None, int]:
    """`rate=R` (requests per second) and `burst=B` (requests at once, default: the rate rounded
    up) of a key's line."""
    found: dict[str, float] = {}
    for word in words:
        key, _, value = word.partition("=")
        if key not in ("rate", "burst"):
            raise ValueError(f"{where}: unknown option {key!r} of {name!r} (rate=, burst=)")
        try:
            found[key] = float(value) if key == "rate" else int(value)
        except ValueError:
            found[key] = 0
        if not math.isfinite(found[key]) or found[key] <= 0:
            raise ValueError(f"{where}: {key} of {name!r} must be a positive number, not {value!r}")
    if "burst" in found and "rate" not in found:
        raise ValueError(f"{where}: burst= of key {name!r} needs a rate=")
    rate = found.get("rate")
    return rate, int(found.get("burst", max(1, math.ceil(rate or 1))))


def parse_keys(text: str, source: str = "keys file") -> list[ApiKey]:
    """The keys of a keys file; ValueError (with the line, never a key) for anything malformed."""
    keys: list[ApiKey] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    allowed = ", ".join(s.value for s in Scope)
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source} line {number}"
        if len(words) < 3:
            raise ValueError(f"{where}: expected NAME SCOPES sha256:DIGEST [rate=R] [burst=B]")
        name, scope_list, key_digest, *rest = words
        if not NAME.match(name) or name in (ANONYMOUS, INVALID):
            raise ValueError(f"{where}: name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
        if name in names:
            raise ValueError(f"{where}: name {name!r} is used twice")
        try:
            scopes = frozenset(Scope(s) for s in scope_list.split(","))
        except ValueError:
            raise ValueError(f"{where}: scopes of {name!r} must be a comma list of {allowed}") from None
        found = DIGEST.match(key_digest)
        if found is None:
            # Never echo the field: it may be a key pasted in by mistake.
            raise ValueError(f"{where}: the key of {name!r} must be given as sha256:<64 hex digits>")
        raw = bytes.fromhex(found.group(1))
        if raw in digests:
            raise ValueError(f"{where}: the key of {name!r} is also another key's")
        keys.append(ApiKey(name, raw, scopes, *_options(name, rest, where)))
        names.add(name)
        digests.add(raw)
    return keys


class KeyStore(Reloadable):
    """The keys in force and the decision for each request that needs a scope.

    Without a keys file (`path` None) every scope but admin is open; with one, every scope needs a
    key that holds it, even when the file lists no keys (emptying the file locks the service
    rather than opening it). Admin needs an admin key in every case.
    """

    kind = "api_keys"

    def __init__(self, path: Path | None, metrics: ServiceMetrics, rates: Rates | None = None) -> None:
        self.path = path
        self.metrics = metrics
        self.rates = rates or LocalRates()
        # The scopes a request uses without a key, which the transports need not ask about: every
        # scope but admin when no keys file is configured, none otherwise.
        self.open_scopes = frozenset(Scope) - {Scope.ADMIN} if path is None else frozenset()
        self.keys: list[ApiKey] = []
        self.pending: tuple[str, float] | None = None  # a change read in place, since when
        self.vetted: tuple[Signature, str] | None = None  # what `changed` found ready to apply
        if path is not None and not self.reload():
            raise UserError(f"GMLP_API_KEYS_FILE {path} cannot be used; the log says why")

    def __repr__(self) -> str:
        return f"API keys file {self.path}"

    @property
    def paths(self) -> list[Path]:
        return [self.path] if self.path is not None else []

    def changed(self) -> bool:
        """True when the file changed and the change may be applied now (module docstring); `reload`
        then applies what was read here."""
        now = signature(self.paths)
        if now == self.seen or self.path is None:
            return False
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError):
            return True  # reload says why
        if not self._safe_now(now, text):
            if self.pending is None or self.pending[0] != text:
                self.pending = (text, time.monotonic())
                log.debug("API keys file %s changed in place; applied once it reads the same", self.path)
                return False
            if time.monotonic() - self.pending[1] < SETTLE_S:
                return False
        self.vetted = (now, text)
        return True

    def _safe_now(self, now: Signature, text: str) -> bool:
        """Whether `text` may be applied at once: a new file (inode), a file that does not parse
        (reload keeps the keys and says why), or one that keeps every key in force as it is."""
        replaced = [s and s[2:] for s in now] != [s and s[2:] for s in self.seen]
        if replaced:
            return True
        try:
            keys = parse_keys(text, str(self.path))
        except ValueError:
            return True
        return bool(text.strip()) and set(self.keys) <= set(keys)

    def reload(self) -> bool:
        """Re-read the file (what `changed` read just before, for the watcher); on failure, or when
        it reads empty while keys are in force, keep the keys in force and log why."""
        if self.path is None:
            return True
        vetted, self.vetted = self.vetted, None
        self.pending = None
        self.seen = vetted[0] if vetted is not None else signature(self.paths)
        try:
            text = vetted[1] if vetted is not None else self.path.read_text()
            if not text.strip() and self.keys:
                raise ValueError(
                    f"{self.path} reads empty (truncated while rewritten?); to remove every key, write a "
                    "comment line such as '# no keys'"
                )
            keys = parse_keys(text, str(self.path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.error("API keys not re-read, the %d in force stay: %s", len(self.keys), exc)
            return self._observe(ok=False)
        self.keys = keys
        log.info("API keys loaded from %s: %s", self.path, ", ".join(k.name for k in keys) or "none")
        return self._observe(ok=True)

    def _observe(self, ok: bool) -> bool:
        self.metrics.api_keys.set(len(self.keys))
        return self.counted(ok)

    async def authorize(self, credential: str | None, scope: Scope, transport: str) -> str:
        """The name of the key that may make this request (`anonymous` when none is needed);
        Unauthenticated, PermissionDenied or RateLimited otherwise. Counted by name and outcome."""
        name = ANONYMOUS
        try:
            if scope in self.open_scopes:
                return name
            if self.path is None:
                raise admin_closed()
            if not credential:
                raise Unauthenticated(
                    ErrorCode.UNAUTHENTICATED,
                    "this route needs an API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                )
            candidate = hashlib.sha256(credential.encode()).digest()
            key: ApiKey | None = None
            for known in self.keys:  # compared with every key, no early exit
                if hmac.compare_digest(known.digest, candidate):
                    key = known
            if key is None:
                name = INVALID
                raise Unauthenticated(ErrorCode.UNAUTHENTICATED, "the API key is not valid")
            name = key.name
            if scope not in key.scopes:
                if scope is Scope.ADMIN and not any(Scope.ADMIN in k.scopes for k in self.keys):
                    raise admin_closed()
                held = ", ".join(sorted(key.scopes))
                raise PermissionDenied(
                    ErrorCode.FORBIDDEN, f"the key {name!r} has scope {held}; this route needs {scope}"
                )
            if key.rate is not None and (wait := await self.rates.take(name, key.rate, key.burst)) > 0:
                raise RateLimited(
                    ErrorCode.RATE_LIMITED,
                    f"the key {name!r} is limited to {key.rate:g} requests/s (burst {key.burst}); "
                    "retry after the Retry-After delay",
                    retry_after_s=max(1, math.ceil(wait)),
                )
        except (Unauthenticated, PermissionDenied, RateLimited) as exc:
            self._count(name, transport, exc.code)  # the refusal's code is its outcome
            raise
        self._count(name, transport, "allowed")
        return name

    def _count(self, name: str, transport: str, outcome: str) -> None:
        self.metrics.key_requests.labels(name, transport, outcome).inc()  # the name, never the key


def admin_closed() -> PermissionDenied:
    return PermissionDenied(
        ErrorCode.FORBIDDEN,
        "admin routes are closed: no API key with scope admin is configured (GMLP_API_KEYS_FILE)",
    )
