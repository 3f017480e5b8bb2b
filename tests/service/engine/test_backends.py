"""The backend seam: `auto`'s choice per CPU, the variant OpenVINO loads, OpenVINO's runtime against
ONNX Runtime's on the tiny exported models, and a service without the openvino package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from contract.check import CHECK_FILE
from contract.cpu import BF16_FLAGS, cpu_flags
from service.engine.backends import auto_backend, open_runtime
from service.engine.runtime import OnnxModel, RuntimeOptions, choose_variant

REPO_ROOT = Path(__file__).resolve().parents[3]
# /proc/cpuinfo flags of CPUs the table in docs/deploy.md names (the relevant part of each).
ZEN5 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
GRANITE_RAPIDS_AMX_ONLY = {"avx2", "avx512f", "amx_tile", "amx_bf16"}
ICE_LAKE = {"avx2", "avx512f", "avx512_vnni"}
HASWELL = {"avx", "avx2", "fma"}


@pytest.mark.parametrize(
    ("device", "flags", "installed", "expected"),
    [
        ("cpu", ZEN5, True, "openvino"),
        ("cpu", SAPPHIRE_RAPIDS, True, "openvino"),
        ("cpu", GRANITE_RAPIDS_AMX_ONLY, True, "openvino"),
        ("cpu", ICE_LAKE, True, "onnxruntime"),  # VNNI int8 on ORT; OpenVINO would compute fp32
        ("cpu", HASWELL, True, "onnxruntime"),
        ("cpu", SAPPHIRE_RAPIDS, False, "onnxruntime"),  # the optional backend is not installed
        ("cuda", SAPPHIRE_RAPIDS, True, "onnxruntime"),  # OpenVINO runs on the CPU only
    ],
)
def test_auto_picks_openvino_only_on_cpus_with_bf16_instructions(device, flags, installed, expected):
    assert auto_backend(device, flags, installed) == expected


def test_openvino_loads_the_fp32_graph_unless_told_otherwise() -> None:
    available = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert choose_variant(available, "cpu", None) == "int8"
    assert choose_variant(available, "cpu", None, "openvino") == "fp32"
    assert choose_variant(available, "cpu", "int8", "openvino") == "int8"


def recorded_inputs(served: Path) -> list[dict[str, np.ndarray]]:
    """The inputs of the export's recorded check, one batch per case."""
    with np.load(served / CHECK_FILE) as data:
        cases = sorted({key.split("/")[0] for key in data.files if key.count("/") == 1})
        return [{k.split("/")[1]: data[k] for k in data.files if k.startswith(f"{case}/")} for case in cases]


@pytest.mark.parametrize("task", ["vision", "mlm"])
def test_openvino_answers_as_onnx_runtime(tiny_vision_served: Path, tiny_mlm_served: Path, task: str) -> None:
    pytest.importorskip("openvino")
    served = tiny_vision_served if task == "vision" else tiny_mlm_served
    path = served / "model.onnx"
    options = RuntimeOptions(intra_op_threads=1, backend="openvino", instances=2)
    model, reference = open_runtime(path, options), OnnxModel(path, RuntimeOptions(intra_op_threads=1))
    assert model.provider == "OpenVINO CPU" and reference.precision is None
    assert model.precision == ("bf16" if BF16_FLAGS & cpu_flags() else "fp32")
    assert model.input_names == reference.input_names and model.output_names == reference.output_names
    for name in model.input_names:
        assert model.static_dims(name) == reference.static_dims(name)
    assert model.row_independent
    atol = 5e-2 if model.precision == "bf16" else 1e-4
    for feeds in recorded_inputs(served):
        rows = [{k: v[i] for k, v in feeds.items()} for i in range(len(next(iter(feeds.values()))))]
        got, expected = model.run_batch(rows), reference.run_batch(rows)
        for row, want in zip(got, expected, strict=True):
            assert row.keys() == want.keys()
            np.testing.assert_allclose(row["logits"], want["logits"], atol=atol)
            assert row["topk_ids"].dtype == want["topk_ids"].dtype
        assert model.run(feeds, ["logits"]).keys() == {"logits"}


def test_openvino_runs_a_lone_row_on_one_stream_of_every_thread(
    tiny_vision_served: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on ONNX Runtime (tests/service/engine/test_lone_threads.py): a one-row run with no other
    run going takes the lone compiled model, batches of several rows the instances' streams, the
    warm-up both; the two give the same logits."""
    pytest.importorskip("openvino")
    path = tiny_vision_served / "model.onnx"
    options = RuntimeOptions(intra_op_threads=1, backend="openvino", instances=2, lone_threads=2)
    model = open_runtime(path, options)
    assert model.lone_session is not None
    for compiled, streams, threads in ((model.session, 2, 2), (model.lone_session, 1, 2)):
        assert int(compiled.get_property("NUM_STREAMS")) == streams
        assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == threads
        assert compiled.get_property("ENABLE_CPU_PINNING") is False  # workers would share cores
    log: list[str] = []
    run_on = model.run_on

    def recording(session: object, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        log.append("lone" if session is model.lone_session else "instance")
        return run_on(session, feeds, names)

    monkeypatch.setattr(model, "run_on", recording)
    (feeds, *_) = recorded_inputs(tiny_vision_served)
    one = {k: v[:1] for k, v in feeds.items()}
    alone = model.run(one, ["logits"])["logits"]
    batched = model.run({k: np.concatenate([v, v]) for k, v in one.items()}, ["logits"])["logits"]
    with model.on_every_session():
        model.run(one, ["logits"])
    assert log == ["lone", "instance", "lone", "instance"]
    atol = 5e-2 if model.precision == "bf16" else 1e-4
    np.testing.assert_allclose(alone[0], batched[1], atol=atol)
    assert open_runtime(path, RuntimeOptions(backend="openvino", lone_threads=1)).lone_session is None


def run_without_openvino(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a Python where `import openvino` fails, as where the extra is not installed."""
    blocked = "import sys; sys.modules['openvino'] = None; " + code
    return subprocess.run(
        [sys.executable, "-c", blocked], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def test_without_openvino_the_server_refuses_it_at_start(tiny_vision_served: Path) -> None:
    code = (
        "from service.cli import main; "
        f"sys.exit(main(['--model-repository', {str(tiny_vision_served.parent)!r}, '--backend', 'openvino']))"
    )
    result = run_without_openvino(code)
    assert result.returncode == 2, result.stderr
    assert "backend openvino needs the openvino package" in result.stderr


def test_without_openvino_auto_runs_onnx_runtime_even_on_a_bf16_cpu() -> None:
    code = (
        "import service.engine.backends as b; b.cpu_flags = lambda: frozenset({'amx_bf16'}); "
        "print(b.resolve_backend('auto', 'cpu'))"
    )
    result = run_without_openvino(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["onnxruntime"]


def test_with_openvino_auto_runs_it_on_a_bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openvino")
    import service.engine.backends as backends

    monkeypatch.setattr(backends, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert backends.resolve_backend("auto", "cpu") == "openvino"
    monkeypatch.setattr(backends, "cpu_flags", lambda: frozenset({"avx2"}))
    assert backends.resolve_backend("auto", "cpu") == "onnxruntime"
