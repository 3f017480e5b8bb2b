"""TLS and mutual TLS on both ports, with a CA made at test time: stock clients with the CA, TLS 1.0
and 1.1 refused, a client without a certificate refused under mutual TLS, a renewed certificate
served without a restart, the container's health probe working with TLS on."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509

from support.certs import Issued, TestCA

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[3]


def _verifying(ca: TestCA, client: Issued | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.pem))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def _start_tls(
    start_server: Any,
    ca: TestCA,
    server_cert: Issued,
    grpc_port: Any,
    *,
    mutual: Issued | None = None,
    **kw: Any,
) -> RunningServer:
    return start_server(
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_client_ca=ca.pem if mutual is not None else None,
        grpc_port=grpc_port(),
        reload_interval_s=0.1,
        client_options={"verify": _verifying(ca, mutual)},
        **kw,
    )


@pytest.fixture(scope="module")
def server_cert(test_ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return test_ca.issue("server", tmp_path_factory.mktemp("server-tls"))


@pytest.fixture(scope="module")
def server(start_server: Any, test_ca: TestCA, server_cert: Issued, grpc_port: Any) -> RunningServer:
    return _start_tls(start_server, test_ca, server_cert, grpc_port)


def _handshake(port: int, context: ssl.SSLContext) -> tuple[str, int]:
    """The protocol and the served certificate's serial number; raises when refused."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return str(tls.version()), x509.load_der_x509_certificate(der).serial_number


def _client_of(version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers only `version` (its own security level lowered so that it can)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("ALL:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = context.maximum_version = version
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


def test_https_and_grpc_tls_with_stock_clients(server: RunningServer, test_ca: TestCA) -> None:
    with server.client() as client:
        assert client.get("/health/ready").status_code == 200
        assert client.post("/fill-mask", json={"text": "a [MASK] day"}).status_code == 200
    triton = grpcclient.InferenceServerClient(
        url=f"localhost:{server.settings.grpc_port}", ssl=True, root_certificates=str(test_ca.pem)
    )
    assert triton.is_server_ready() and triton.is_model_ready("tiny-mlm")
    triton.close()
    curl = subprocess.run(
        ["curl", "-sS", "--cacert", str(test_ca.pem), f"https://localhost:{server.port}/health/ready"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert curl.returncode == 0 and '"ready"' in curl.stdout, curl.stderr
    plain = subprocess.run(
        ["curl", "-sS", f"https://localhost:{server.port}/health/ready"], capture_output=True, timeout=30
    )
    assert plain.returncode != 0  # without the CA, curl does not trust the server


@pytest.mark.parametrize("port_of", ["http", "grpc"])
def test_tls_1_0_and_1_1_are_refused_and_1_2_and_1_3_served(server: RunningServer, port_of: str) -> None:
    port = server.port if port_of == "http" else server.settings.grpc_port
    for old in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(port, _client_of(old))
    assert _handshake(port, _client_of(ssl.TLSVersion.TLSv1_2))[0] == "TLSv1.2"
    assert _handshake(port, _client_of(ssl.TLSVersion.TLSv1_3))[0] == "TLSv1.3"


def test_a_renewed_certificate_is_served_without_a_restart(
    start_server: Any, test_ca: TestCA, grpc_port: Any, tmp_path: Path
) -> None:
    first = test_ca.issue("renewed", tmp_path)
    server = _start_tls(start_server, test_ca, first, grpc_port)
    context = _verifying(test_ca)
    ports = (server.port, server.settings.grpc_port)
    context.set_alpn_protocols(["h2", "http/1.1"])
    assert all(_handshake(port, context)[1] == first.serial for port in ports)
    renewed = test_ca.issue("renewed", tmp_path)  # same paths, new key and certificate
    for port in ports:
        server.wait_for(lambda port=port: _handshake(port, context)[1] == renewed.serial)
    with server.client() as client:
        assert client.get("/models").status_code == 200
    assert server.metric("gmlp_file_reloads_total", file="tls", result="ok") >= 1


def test_mutual_tls_refuses_clients_without_a_certificate_on_both_ports(
    start_server: Any, test_ca: TestCA, server_cert: Issued, grpc_port: Any, tmp_path: Path
) -> None:
    client_cert = test_ca.issue("client", tmp_path)
    server = _start_tls(start_server, test_ca, server_cert, grpc_port, mutual=client_cert)
    with server.client() as client:  # with the client certificate
        assert client.get("/models").status_code == 200
    with (
        pytest.raises(httpx.TransportError),
        httpx.Client(verify=_verifying(test_ca), timeout=10) as anonymous,
    ):
        anonymous.get(f"{server.url}/models")
    address = f"localhost:{server.settings.grpc_port}"
    without = grpcclient.InferenceServerClient(url=address, ssl=True, root_certificates=str(test_ca.pem))
    with pytest.raises(Exception, match="(?i)unavailable|handshake|ssl|certificate|connect"):
        without.is_server_live(client_timeout=10)
    without.close()
    with_cert = grpcclient.InferenceServerClient(
        url=address,
        ssl=True,
        root_certificates=str(test_ca.pem),
        private_key=str(client_cert.key),
        certificate_chain=str(client_cert.cert),
    )
    assert with_cert.is_server_live()
    with_cert.close()
    # The container's probe, as the Dockerfile runs it, with the server's settings in its environment.
    env = {
        **os.environ,
        "GMLP_PORT": str(server.port),
        "GMLP_TLS_CERT": str(server_cert.cert),
        "GMLP_TLS_KEY": str(server_cert.key),
        "GMLP_TLS_CLIENT_CA": str(test_ca.pem),
    }
    probe = [sys.executable, "-m", "service.healthcheck"]
    assert subprocess.run(probe, cwd=REPO, env=env, timeout=30).returncode == 0
    stranger = TestCA(tmp_path / "other", name="another CA").issue("stranger")
    env["GMLP_HEALTHCHECK_CERT"], env["GMLP_HEALTHCHECK_KEY"] = str(stranger.cert), str(stranger.key)
    assert subprocess.run(probe, cwd=REPO, env=env, timeout=30).returncode == 1


def test_the_health_probe_speaks_https(server: RunningServer, server_cert: Issued) -> None:
    env = {**os.environ, "GMLP_PORT": str(server.port), "GMLP_TLS_CERT": str(server_cert.cert)}
    env.pop("GMLP_TLS_CLIENT_CA", None)
    probe = [sys.executable, "-m", "service.healthcheck"]
    assert subprocess.run(probe, cwd=REPO, env=env, timeout=30).returncode == 0
    env.pop("GMLP_TLS_CERT")  # plain HTTP to a TLS port: not healthy
    assert subprocess.run(probe, cwd=REPO, env=env, timeout=30).returncode == 1
