"""A test certificate authority, made at test time with `cryptography` (nothing committed).

`TestCA(dir)` writes `ca.pem`; `issue(name)` writes `<name>.pem` / `<name>.key`, a certificate for
127.0.0.1 and localhost usable by servers and clients alike (as the health probe needs under mutual
TLS). Each call issues a new certificate (a new serial), so a test can tell a renewed one apart.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class TestCA:
    """A self-signed CA in `directory`; `issue` signs leaf certificates with it."""

    __test__ = False  # not a test class

    def __init__(self, directory: Path, name: str = "gmlp test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{name.replace(' ', '-')}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, directory: Path | None = None) -> Issued:
        """A new key and certificate for 127.0.0.1/localhost, for server and client use."""
        where = directory or self.directory
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = where / f"{name}.pem", where / f"{name}.key"
        # The key first, then the certificate, each replaced atomically, as a renewal would.
        for path, data in (
            (key_path, _pem_key(key)),
            (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
        ):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return Issued(cert_path, key_path, serial)


__all__ = ["TestCA", "Issued"]
