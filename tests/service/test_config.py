"""Settings (their groups, flags and the docs' tables made from them), the model repository
(including export of missing checkpoints), the runtime."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from contract.scan import scan
from contract.spec import SpecError, read_spec
from contract.work import block_macs
from gmlp.serve_command import export_missing
from service.cli import (
    SETTINGS_BEGIN,
    SETTINGS_END,
    add_serve_arguments,
    run_serve,
    settings_from_args,
    settings_tables,
)
from service.engine.runtime import OnnxModel, RuntimeOptions, choose_variant, cuda_available, resolve_device
from service.settings import LONE_MIN_BLOCK_MACS, Group, ServiceSettings, available_cpus, group_of
from support.helpers import REPO_ROOT

pytestmark = pytest.mark.timeout(120)


def settings_from_cli(argv: list[str]) -> ServiceSettings:
    """The settings `gmlp serve` would run with, given `argv`."""
    return settings_from_args(add_serve_arguments(argparse.ArgumentParser()).parse_args(argv))


def test_env_prefix_and_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GMLP_MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("GMLP_DEVICE", "cpu")
    monkeypatch.setenv("GMLP_VARIANT", "")  # empty means unset
    settings = ServiceSettings()
    assert (settings.max_batch_size, settings.device, settings.variant) == (3, "cpu", None)
    settings = settings_from_cli(["--max-batch-size", "7", "--variant", "fp32", "--no-ort-spinning"])
    assert (settings.max_batch_size, settings.variant, settings.device, settings.ort_spinning) == (
        7,
        "fp32",
        "cpu",
        False,
    )


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        ServiceSettings(max_batch_size=0)
    with pytest.raises(SystemExit):  # argparse refuses values outside the choices
        settings_from_cli(["--device", "tpu"])
    parser = add_serve_arguments(argparse.ArgumentParser())
    assert run_serve(parser.parse_args(["--port", "-5"])) == 2


def test_every_setting_has_a_flag_and_a_description() -> None:
    parser = add_serve_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    for name, field in ServiceSettings.model_fields.items():
        assert hasattr(args, f"serve_{name}") and field.description
    assert settings_from_args(args) == ServiceSettings()


def test_every_setting_has_a_group_and_a_one_line_description() -> None:
    groups = {name: group_of(field) for name, field in ServiceSettings.model_fields.items()}
    assert set(groups.values()) == set(Group), "a group without settings"
    for name, field in ServiceSettings.model_fields.items():
        assert field.description and "|" not in field.description, name


def test_serve_help_lists_the_flags_by_group() -> None:
    help_text = add_serve_arguments(argparse.ArgumentParser()).format_help()
    titles = [f"{group.heading} settings:" for group in Group]
    starts = [help_text.index(title) for title in titles]
    assert starts == sorted(starts), "the groups in their declared order"
    sections = [help_text[a:b] for a, b in zip(starts, [*starts[1:], len(help_text)], strict=True)]
    for name, field in ServiceSettings.model_fields.items():
        flag = re.compile(rf"^  --{name.replace('_', '-')}\b", re.MULTILINE)
        holding = [group for group, text in zip(Group, sections, strict=True) if flag.search(text)]
        assert holding == [group_of(field)], (name, holding)


def _committed_tables() -> str:
    text = (REPO_ROOT / "docs" / "service.md").read_text()
    return text.split(SETTINGS_BEGIN, 1)[1].split(SETTINGS_END, 1)[0].strip()


def test_the_settings_tables_in_the_docs_are_generated_from_the_settings() -> None:
    expected = settings_tables().strip()
    assert _committed_tables() == expected, (
        "docs/service.md's settings tables differ from service/settings.py: run `make settings-docs`, "
        f"or paste between the markers:\n\n{expected}"
    )
    # And they are the settings: one row per field, each with its variable and flag.
    rows = re.findall(r"^\| `(GMLP_\w+)` \| `(--[\w-]+)`", _committed_tables(), re.MULTILINE)
    assert rows == [(f"GMLP_{n.upper()}", "--" + n.replace("_", "-")) for n in ServiceSettings.model_fields]


def test_the_readme_names_real_settings_with_their_defaults() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `GMLP_(\w+)` \| `([^`]*)` \|", readme, re.MULTILINE)
    assert len(rows) >= 10
    defaults = ServiceSettings.model_construct()  # the built-in defaults, not this environment's
    for name, shown in rows:
        field = name.lower()
        assert field in ServiceSettings.model_fields, f"README names GMLP_{name}, which is no setting"
        value = getattr(defaults, field)
        written = (
            "(unset)" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )
        assert shown == written, (name, shown, written)
    assert "(docs/service.md#settings)" in readme


def test_gmlp_cli_has_the_serve_subcommand() -> None:
    from gmlp import serve_command
    from gmlp.cli import build_parser

    args = build_parser().parse_args(["serve", "--port", "0", "--max-queue-delay-ms", "1.5"])
    assert args.handler is serve_command.run
    assert settings_from_args(args).max_queue_delay_ms == 1.5


def test_available_cpus_respects_the_affinity_mask() -> None:
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
    assert ServiceSettings(intra_op_threads=None).resolved_threads() == available_cpus()
    assert ServiceSettings(intra_op_threads=3).resolved_threads() == 3


def test_instances_share_out_the_cpus() -> None:
    cpus = available_cpus()
    auto = ServiceSettings()
    instances = auto.resolved_instances("cpu")
    assert instances == (2 if cpus >= 2 else 1)
    assert auto.resolved_threads(instances) == max(1, cpus // instances)
    assert auto.resolved_instances("cuda") == 1
    # Threads set explicitly: instances only where they fit beside them.
    assert ServiceSettings(intra_op_threads=cpus).resolved_instances("cpu") == 1
    explicit = ServiceSettings(instances=3, intra_op_threads=1)
    assert explicit.resolved_instances("cuda") == 3 and explicit.resolved_threads(3) == 1
    assert ServiceSettings(instances=64).resolved_threads(64) == 1


def test_front_ends_come_from_the_cpus_unless_set() -> None:
    """One process up to 4 CPUs, then a front-end for every 4 (rounded up); given, as given."""
    cpus = {1: 1, 2: 1, 4: 1, 5: 2, 8: 2, 9: 3, 16: 4, 64: 16}
    assert {n: ServiceSettings(cpus=n).resolved_workers() for n in cpus} == cpus
    assert ServiceSettings(cpus=16, workers=1).resolved_workers() == 1
    assert ServiceSettings(cpus=2, workers=3).resolved_workers() == 3


def test_a_lone_batch_gets_every_cpu_unless_set() -> None:
    assert ServiceSettings().resolved_lone_threads("cpu") == available_cpus()
    assert ServiceSettings(cpus=3).resolved_lone_threads("cpu") == 3
    assert ServiceSettings(lone_threads=0).resolved_lone_threads("cpu") == 0
    assert ServiceSettings(lone_threads=5).resolved_lone_threads("cpu") == 5
    assert ServiceSettings(lone_threads=5).resolved_lone_threads("cuda") == 0


def test_a_lone_batch_gets_every_cpu_by_a_rule_of_the_models_shapes() -> None:
    """Unset, the lone session follows the model's work per block (its config's shapes), the same
    decision on every start: off for the demo classifier's blocks, on for gMLP-S/16's and the
    masked LM's at its full window; given, the setting is used as given."""
    from model import get_config

    classifier = get_config("gmlp_cifar_p4", depth=10, d_model=128, d_ffn=512).to_dict()
    mlm = json.loads((REPO_ROOT / "checkpoints" / "gutenberg-gmlp-mlm" / "config.json").read_text())["model"]
    s16 = get_config("gmlp_s16_224").to_dict()
    unset, cpus = ServiceSettings(cpus=4), 4
    for model, threads in ((classifier, 0), (mlm, cpus), (s16, cpus), ({}, 0)):
        assert unset.lone_threads_for("cpu", block_macs(model)) == threads, model
    assert block_macs(classifier) < LONE_MIN_BLOCK_MACS <= min(block_macs(mlm), block_macs(s16))
    assert unset.lone_threads_for("cuda", block_macs(s16)) == 0
    assert ServiceSettings(lone_threads=3).lone_threads_for("cpu", block_macs(classifier)) == 3
    assert ServiceSettings(lone_threads=0).lone_threads_for("cpu", block_macs(s16)) == 0


def test_variant_choice() -> None:
    both = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert choose_variant(both, "cpu", None) == "int8"
    assert choose_variant(both, "cuda", None) == "fp32"
    assert choose_variant({**both, "fp16": "model.fp16.onnx"}, "cuda", None) == "fp16"
    assert choose_variant(both, "cpu", "fp32") == "fp32"
    assert choose_variant({"fp32": "model.onnx"}, "cpu", "int8") == "fp32"  # not exported: default


@pytest.mark.skipif(cuda_available(), reason="checks the CPU fallback")
def test_cuda_request_falls_back_to_cpu_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="service.engine.runtime"):
        assert resolve_device("cuda") == "cpu"
    assert "running on CPU" in caplog.text
    assert resolve_device("auto") == "cpu"


def test_scan_names_both_models(repository: Path) -> None:
    specs = {
        name: source.versions[source.complete_versions()[-1]].spec
        for name, source in scan(repository).items()
    }
    assert {name: spec.task for name, spec in specs.items()} == {
        "tiny-vision": "image-classification",
        "tiny-mlm": "fill-mask",
    }
    assert specs["tiny-vision"].labels()[0] == "airplane"
    assert specs["tiny-mlm"].tokenizer_path().is_file()


def test_repository_errors(tmp_path: Path, tiny_vision_served: Path) -> None:
    shutil.copytree(tiny_vision_served, tmp_path / "b")
    (tmp_path / "b" / "model.int8.onnx").unlink()
    with pytest.raises(SpecError, match="variant files missing"):
        read_spec(tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"format": "something-else"}))
    assert read_spec(tmp_path / "c") is None


def test_missing_exports_are_made_from_checkpoints(tmp_path: Path, tiny_vision_checkpoint: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(tiny_vision_checkpoint, checkpoints / "demo-vision")
    written = export_missing(checkpoints, tmp_path / "models", ("fp32",))
    assert written == [tmp_path / "models" / "demo-vision"]
    assert list(scan(tmp_path / "models")) == ["demo-vision"]
    assert (tmp_path / "models" / "demo-vision" / "model.onnx").is_file()
    # Second start: nothing to export, same result.
    assert export_missing(checkpoints, tmp_path / "models") == []
    assert list(scan(tmp_path / "models")) == ["demo-vision"]


def test_run_serve_reports_an_unusable_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = add_serve_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--model-repository", str(tmp_path), "--checkpoint-dir", ""])
    assert run_serve(args) == 1
    assert "no served models" in capsys.readouterr().err


def test_runtime_batches_rows_independently(tiny_vision_served: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [{"pixel_values": rng.standard_normal((3, 32, 32)).astype(np.float32) * s} for s in (1, 5, 0.1)]
    for variant in ("model.onnx", "model.int8.onnx"):
        model = OnnxModel(tiny_vision_served / variant, RuntimeOptions(intra_op_threads=1))
        assert model.provider == "CPUExecutionProvider"
        batched = model.run_batch(rows)
        single = [model.run_batch([row])[0] for row in rows]
        assert all(b["logits"].shape == (10,) for b in batched)
        if model.row_independent:  # fp32: the same up to float rounding
            for b, s in zip(batched, single, strict=True):
                np.testing.assert_allclose(b["logits"], s["logits"], rtol=0, atol=1e-5)
        else:  # int8 scales activations per tensor, so its rows run one at a time: identical
            assert variant == "model.int8.onnx"
            for b, s in zip(batched, single, strict=True):
                np.testing.assert_array_equal(b["logits"], s["logits"])


def test_the_service_does_not_import_torch() -> None:
    """The serving image has no torch: nothing on the request path may import it."""
    code = (
        "import sys, service.app, service.http.routes, service.http.hf, service.cli; "
        "import service.v2.rest, service.v2.grpc_server; "
        "from service.settings import ServiceSettings; service.app.create_app(ServiceSettings()); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'export' not in sys.modules and 'model' not in sys.modules"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_row_independence_without_the_onnx_package(tiny_vision_served: Path) -> None:
    # The serving image has no `onnx`: the served-model contract decides (int8 = dynamic quantisation).
    code = (
        "import sys; sys.modules['onnx'] = None; from pathlib import Path; "
        "import onnxruntime as ort; from service.engine.runtime import rows_are_independent as r; "
        f"d = Path({str(tiny_vision_served)!r}); "
        "s = lambda name: ort.InferenceSession(str(d / name), providers=['CPUExecutionProvider'])"
        ".get_modelmeta().custom_metadata_map; "
        "assert r(s('model.onnx'), d / 'model.onnx') and not r(s('model.int8.onnx'), d / 'model.int8.onnx')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
