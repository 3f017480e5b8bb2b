"""TLS for both ports from one set of files, re-read when they change.

`GMLP_TLS_CERT` (the chain, PEM) and `GMLP_TLS_KEY` turn TLS on; `GMLP_TLS_CLIENT_CA` also requires
a client certificate issued by that CA (mutual TLS). TLS 1.2 and 1.3 only; TLS 1.2 with forward
secret AEAD suites only (ECDHE with AES-GCM or ChaCha20-Poly1305); TLS 1.3's suites are all
strong. The HTTP server gets one `ssl.SSLContext` (`context`) whose certificate is replaced in
place when the files change, so new connections get the new certificate while open ones keep
theirs; the gRPC server reads the current PEM bytes (`pem`, with `generation` telling it when they
changed). A renewed pair that does not load (say, a key that does not match its certificate, or
half-written files) keeps the old one, and the log says why. A client CA that changes is added to
the trusted ones; one removed stays trusted until a restart.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from contract.errors import UserError
from service.access.watch import Reloadable, signature
from service.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)

TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes
    client_ca: bytes | None


def _context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class TlsFiles(Reloadable):
    """The certificate, key and client CA in force; `reload` re-reads them (see the module doc)."""

    kind = "tls"

    def __init__(self, cert: Path, key: Path, client_ca: Path | None, metrics: ServiceMetrics) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.metrics = metrics
        self.generation = 0
        self.seen = signature(self.paths)
        try:
            self.context = _context(cert, key, client_ca)
            self.pem = self._read()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise UserError(f"GMLP_TLS_CERT / _KEY / _CLIENT_CA cannot be used: {exc}") from exc

    def __repr__(self) -> str:
        return f"TLS files {self.cert}, {self.key}"

    @property
    def paths(self) -> list[Path]:
        return [p for p in (self.cert, self.key, self.client_ca) if p is not None]

    def _read(self) -> Pem:
        return Pem(
            self.cert.read_bytes(),
            self.key.read_bytes(),
            self.client_ca.read_bytes() if self.client_ca is not None else None,
        )

    def reload(self) -> bool:
        """Load the files into a scratch context first: only a pair that loads replaces the live one."""
        self.seen = signature(self.paths)
        try:
            _context(self.cert, self.key, self.client_ca)
            pem = self._read()
            self.context.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                self.context.load_verify_locations(self.client_ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("TLS files not re-read, the certificate in force stays: %s", exc)
            return self.counted(False)
        if pem != self.pem:
            self.pem = pem
            self.generation += 1
            log.info("TLS certificate re-read from %s", self.cert)
        return self.counted(True)
