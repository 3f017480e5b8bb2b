"""schemathesis, every check, every operation, against a real server: the OpenAPI document is the truth.

Every check runs (`--checks all`): responses and statuses must be documented, schema-invalid
requests refused, schema-valid ones accepted. Two allowances, both narrow:

- the content operations (every POST) may refuse a schema-valid request with the transport's
  "invalid" status (REST 422, v2 400), since JSON Schema cannot state "a decodable image", "at most
  32 tokens" or "this model's input names"; `st_hooks.py` then checks the refusal is one of those
  reasons and not a validation error, which would mean the schema left out a constraint;
- nothing else: GET operations keep schemathesis' own expectations.

A fixed seed keeps CI reproducible; GMLP_SCHEMATHESIS_SEED / _EXAMPLES explore further by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.keys import write_keys

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve().parent
CONFIG = """
seed = {seed}

[[operations]]
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "422"]
"""


def test_schemathesis_finds_nothing(start_server: Any, tmp_path: Path) -> None:
    # With a key of every scope (sent on every request), so that the admin operations are reached
    # too; schemathesis' own checks also send none or a wrong one and expect the documented 401.
    key = write_keys(tmp_path / "keys", operator="infer,admin,metrics")["operator"]
    server: RunningServer = start_server(api_keys_file=tmp_path / "keys")
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(seed=int(os.environ.get("GMLP_SCHEMATHESIS_SEED", "1"))))
    examples = os.environ.get("GMLP_SCHEMATHESIS_EXAMPLES", "25")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "st_hooks", "PYTHONPATH": str(HERE), "NO_COLOR": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"]
        + [f"{server.url}/openapi.json", "--checks", "all", "--max-examples", examples, "--no-color"]
        + ["--header", f"Authorization: Bearer {key}"],
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
        env=env,
    )
    summary = run.stdout[-6000:]
    assert run.returncode == 0, summary
    operations = sum(len(methods) for methods in server.app.openapi()["paths"].values())
    assert f"Selected: {operations}/{operations}" in run.stdout and "passed" in run.stdout, summary
