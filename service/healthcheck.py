"""Container health probe: exit 0 when this machine's service answers /health/ready with 200.

Used by the Dockerfile's HEALTHCHECK and docker-compose.yml (`python -m service.healthcheck`); the
slim images have no curl, and this keeps the probe in one place. It reads the server's own
settings from the environment: with `GMLP_TLS_CERT` it speaks HTTPS to 127.0.0.1 (the certificate
is not checked: the probe asks its own process whether it is ready, over loopback), and under
mutual TLS (`GMLP_TLS_CLIENT_CA`) it presents `GMLP_HEALTHCHECK_CERT` / `GMLP_HEALTHCHECK_KEY`,
by default the server's own certificate and key (which must then be issued by the client CA for
client use too). Health routes need no API key.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request


def _context() -> ssl.SSLContext | None:
    cert = os.environ.get("GMLP_TLS_CERT")
    if not cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if os.environ.get("GMLP_TLS_CLIENT_CA"):
        context.load_cert_chain(
            os.environ.get("GMLP_HEALTHCHECK_CERT") or cert,
            os.environ.get("GMLP_HEALTHCHECK_KEY") or os.environ.get("GMLP_TLS_KEY"),
        )
    return context


def main() -> int:
    port = os.environ.get("GMLP_PORT", "8000")
    try:
        context = _context()
        scheme = "https" if context is not None else "http"
        url = f"{scheme}://127.0.0.1:{port}/health/ready"
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
