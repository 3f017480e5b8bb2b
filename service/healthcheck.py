"""Container health probe: exit 0 when this machine's service answers /health/ready with 200.

Used by the Dockerfile's HEALTHCHECK and docker-compose.yml (`python -m service.healthcheck`); the
slim images have no curl, and this keeps the probe in one place.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("GMLP_PORT", "8000")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
