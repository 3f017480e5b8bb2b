"""Triton's perf_analyzer, the real binary, against a real server on its own generated data.

perf_analyzer reads a model's metadata and configuration, fills every input they list and asks for
every output, then reads the server's statistics for the model it measured. Each v2 form has its
own name so that it sends one form: the graph's tensors under the model's name (random bytes for a
classifier's pixels, zeros for a masked LM's indices), the encoded input under NAME-ensemble (its
`--string-data` for a masked LM's text). Each run is bounded: a few requests in count windows.

The binary is the one `python -m benchmarks.perf_analyzer_install` installs (recorded in
.bench-tools/), else a `perf_analyzer` on PATH; without either the tests skip and say so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
WINDOW = ["--concurrency-range", "1", "--measurement-mode", "count_windows"]
WINDOW += ["--measurement-request-count", "4", "--max-trials", "3", "--stability-percentage", "999"]
RUNS = {
    "tiny-vision": ["--input-data", "random"],
    "tiny-mlm": ["--input-data", "zero", "--shape", "input_ids:16", "--shape", "mask_positions:1"],
    "tiny-mlm-ensemble": ["--string-data", "the [MASK] sat on the mat."],
}


def _command() -> list[str] | None:
    """The installed perf_analyzer's command line (the recorded one first), or None."""
    for recorded in sorted(ROOT.glob(".bench-tools/perf_analyzer-*/command.json")):
        command = json.loads(recorded.read_text())
        if Path(command[-1]).exists():
            return list(command)
    on_path = shutil.which("perf_analyzer")
    return [on_path] if on_path else None


@pytest.fixture(scope="module")
def perf_analyzer() -> list[str]:
    command = _command()
    if command is None:
        pytest.skip("perf_analyzer is not installed: python -m benchmarks.perf_analyzer_install")
    return command


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("model", sorted(RUNS))
def test_perf_analyzer_runs_on_its_own_data(
    perf_analyzer: list[str],
    triton_server: RunningServer,
    triton_clients: dict[str, Any],
    model: str,
    transport: str,
) -> None:
    port = triton_server.port if transport == "http" else triton_server.settings.grpc_port
    before = _inferences(triton_clients["http"], model)
    args = ["-m", model, "-u", f"127.0.0.1:{port}", "-i", transport, *RUNS[model], *WINDOW]
    done = subprocess.run([*perf_analyzer, *args], capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Inferences/Second vs. Client Average Batch Latency" in output, output[-3000:]
    # The server counted the requests under the name measured (its statistics are the model's).
    assert _inferences(triton_clients["http"], model) >= before + 4


def _inferences(client: Any, model: str) -> int:
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    assert stats["name"] == model
    return int(stats["inference_count"])
