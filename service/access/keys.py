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

import fcntl
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

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


# A shared bucket's state in its file: tokens, and when they were counted (time.monotonic, which
# is the same clock in every process of the machine).
_STATE = struct.Struct("=dd")


@dataclass
class SharedTokenBucket(TokenBucket):
    """A `TokenBucket` that every worker process of one server draws from, so that a key's rate
    holds for the server rather than for each worker: its state lives in `path` (in the folder the
    supervisor shares with its workers) and is read and written under an exclusive lock."""

    path: Path = field(kw_only=True)
    # Set once the file failed (its folder removed under the server): the bucket is then this
    # worker's own, and requests are still decided rather than failed.
    alone: bool = field(default=False, init=False)

    def take(self, now: float) -> float:
        if self.alone:
            return super().take(now)
        try:
            return self._take_shared(now)
        except OSError as exc:
            log.error("rate bucket %s failed (%s): this worker now limits the key on its own", self.path, exc)
            self.alone = True
            return super().take(now)

    def _take_shared(self, now: float) -> float:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            state = os.pread(fd, _STATE.size, 0)
            if len(state) == _STATE.size:  # else the first take of any worker: a full bucket
                self.tokens, self.at = _STATE.unpack(state)
            wait = super().take(max(now, self.at))  # `now` was read before the lock was held
            os.pwrite(fd, _STATE.pack(self.tokens, self.at), 0)
            return wait
        finally:
            os.close(fd)  # and the lock with it


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

    def __init__(self, path: Path | None, metrics: ServiceMetrics, shared: Path | None = None) -> None:
        self.path = path
        self.metrics = metrics
        self.shared = shared  # the workers' shared folder: rates hold for the whole server
        # The scopes a request uses without a key, which the transports need not ask about: every
        # scope but admin when no keys file is configured, none otherwise.
        self.open_scopes = frozenset(Scope) - {Scope.ADMIN} if path is None else frozenset()
        self.keys: list[ApiKey] = []
        self.buckets: dict[str, TokenBucket] = {}
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
        old = {k.name: k for k in self.keys}
        self.buckets = {
            k.name: self.buckets[k.name]
            if k.name in self.buckets and (old[k.name].rate, old[k.name].burst) == (k.rate, k.burst)
            else self._bucket(k)
            for k in keys
            if k.rate is not None
        }
        self.keys = keys
        log.info("API keys loaded from %s: %s", self.path, ", ".join(k.name for k in keys) or "none")
        return self._observe(ok=True)

    def _bucket(self, key: ApiKey) -> TokenBucket:
        """A new bucket of the key's rate: one of this process's, or the server's shared one (named
        by the key and its limits, so that changed limits start full, as here)."""
        assert key.rate is not None
        if self.shared is None:
            return TokenBucket(key.rate, key.burst)
        name = hashlib.sha256(f"{key.name}\0{key.rate!r}\0{key.burst}".encode()).hexdigest()[:32]
        return SharedTokenBucket(key.rate, key.burst, path=self.shared / f"rate-{name}")

    def _observe(self, ok: bool) -> bool:
        self.metrics.api_keys.set(len(self.keys))
        return self.counted(ok)

    def authorize(self, credential: str | None, scope: Scope, transport: str) -> str:
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
            bucket = self.buckets.get(name)
            wait = bucket.take(time.monotonic()) if bucket is not None else 0.0
            if bucket is not None and wait > 0:
                raise RateLimited(
                    ErrorCode.RATE_LIMITED,
                    f"the key {name!r} is limited to {bucket.rate:g} requests/s (burst {bucket.burst}); "
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
