"""The JSON log format's handling of what native code writes (`service.telemetry.logs`), in a real
process: its standard output and error descriptors written to directly, as ONNX Runtime's and
gRPC's C++ loggers do, and by Python's print and logging."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.telemetry.logs import native_line

REPO = Path(__file__).resolve().parents[3]

ORT = "2026-12-01 23:59:00.123456789 [W:onnxruntime:, graph.cc:42 Clean] Removing initializer 'x'"
ABSL = "E1201 23:59:00.123456   4242 chttp2_transport.cc:1234] keepalive ping failed"
CHILD = f"""
import logging, os, sys
from service.telemetry.logs import configure_logging
from service.settings import ServiceSettings
configure_logging(ServiceSettings(log_format="json"))
os.write(2, {ORT!r}.encode() + b"\\n")
os.write(2, {ABSL!r}.encode() + b"\\npartial ")
os.write(2, b"line\\n\\n")
os.write(1, b'{{"already": "json"}}\\n')
print("printed", flush=True)
logging.getLogger("service.test").warning("logged %d", 7)
"""


def test_every_line_a_process_writes_is_a_json_object() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    err = [json.loads(line) for line in done.stderr.splitlines()]
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["logger"], e["level"]) for e in err] == [
        ("onnxruntime", "WARNING"),
        ("grpc", "ERROR"),
        ("stderr", "ERROR"),
        ("service.test", "WARNING"),
    ]
    assert err[0]["message"] == "Removing initializer 'x'" and err[1]["message"] == "keepalive ping failed"
    assert err[2]["message"] == "partial line" and err[3]["message"] == "logged 7"
    assert out[0] == {"already": "json"}
    assert (out[1]["logger"], out[1]["message"]) == ("stdout", "printed")


@pytest.mark.parametrize("text", ["{not json}", "[1, 2]", "plain"])
def test_a_line_that_is_not_a_json_object_is_wrapped(text: str) -> None:
    line = json.loads(native_line(text + "\n", "stdout"))
    assert line["message"] == text and line["logger"] == "stdout" and line["level"] == "INFO"
