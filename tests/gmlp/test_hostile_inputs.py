"""Hostile or careless inputs to the `gmlp` commands, run as the real console script under a memory
cap: each ends in one line `gmlp <command>: error: ...` and exit status 1, never a traceback, and
a config that declares far more than its weights is refused before it costs memory."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from support.helpers import BERT_TOKENIZER

# What the commands cost without the inputs (python, torch, onnx imported: about 0.8 GB of address
# space) plus 1.5 GiB: any input that makes a command allocate gigabytes fails under it.
PROBE = "import torch, onnx, onnxruntime, export, model.lucidrains_import, model.train.evaluate"
HEADROOM = 3 << 29  # 1.5 GiB


@pytest.fixture(scope="module")
def memory_cap() -> int:
    """The address-space cap (bytes) the commands run under: the probe's peak plus HEADROOM."""
    peak = subprocess.run(
        [sys.executable, "-c", f"{PROBE}; print(open('/proc/self/status').read())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    kib = next(int(line.split()[1]) for line in peak.splitlines() if line.startswith("VmPeak:"))
    return kib * 1024 + HEADROOM


def run_gmlp(cap: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m gmlp ARGS` with its address space capped at `cap` bytes."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, "-m", "gmlp", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def one_line_error(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The single error line of a refused command (asserted: exit 1, one line, no traceback)."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"gmlp {command}: error: ")
    assert done.returncode == 1
    return lines[0]


def test_a_deep_lucidrains_config_beside_two_floats_is_refused_before_planning(
    tmp_path: Path, memory_cap: int
) -> None:
    """depth 10**6 would plan ten million keys (gigabytes) before comparing one shape."""
    save_file({"to_logits.0.weight": torch.zeros(2)}, tmp_path / "w.safetensors")
    config = {"image_size": 32, "patch_size": 4, "num_classes": 10, "dim": 8, "depth": 10**6}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = run_gmlp(
        memory_cap, "convert-lucidrains", tmp_path / "w.safetensors", "--config", tmp_path / "config.json",
        "--out", tmp_path / "out",
    )  # fmt: skip
    line = one_line_error(done, "convert-lucidrains")
    assert "holds 1 tensors, its config declares 10,000,006 (depth 1000000" in line
    assert not (tmp_path / "out").exists()


def test_an_export_whose_config_declares_a_far_larger_model_names_the_shapes(
    tmp_path: Path, tiny_vision_checkpoint: Path, memory_cap: int
) -> None:
    """The declared model (d_model 8192, d_ffn 65536: gigabytes) is never allocated: the weights'
    header is compared with the config's shapes first."""
    bad = tmp_path / "declared-large"
    shutil.copytree(tiny_vision_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    config["model"].update(d_model=8192, d_ffn=65536)
    (bad / "config.json").write_text(json.dumps(config))
    done = run_gmlp(memory_cap, "export", bad, "--out", tmp_path / "never")
    line = one_line_error(done, "export")
    assert "does not fit the model" in line and "the model expects (65536, 8192)" in line
    assert not (tmp_path / "never").exists()


def test_a_circulant_model_too_large_for_memory_is_refused_before_it_is_built(
    tmp_path: Path, memory_cap: int
) -> None:
    """A circulant SGU's n values become an n x n matrix: weights of a few hundred KB can declare a
    model of gigabytes, refused with the size it needs."""
    from model.lucidrains_import import _key_plan, lucidrains_config

    args = {"num_tokens": 30522, "dim": 4, "depth": 1, "seq_len": 40_000, "circulant_matrix": True}
    plan = _key_plan(lucidrains_config(args), circulant=True)
    save_file({key: torch.zeros(shape) for key, _, shape in plan}, tmp_path / "w.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(args))
    done = run_gmlp(
        memory_cap, "convert-lucidrains", tmp_path / "w.safetensors", "--config", tmp_path / "config.json",
        "--tokenizer", BERT_TOKENIZER, "--out", tmp_path / "out",
    )  # fmt: skip
    line = one_line_error(done, "convert-lucidrains")
    assert "the model it declares needs 6.0 GiB as float32" in line  # 40,000 x 40,000 floats
    assert "GiB this process may use" in line
    assert not (tmp_path / "out").exists()


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("command", ["convert-lucidrains", "info", "export", "eval", "model-card", "inline"])
def test_a_config_nested_100000_deep_is_one_line(
    tmp_path: Path, tiny_vision_checkpoint: Path, memory_cap: int, command: str
) -> None:
    """json.loads recurses per level: 100,000 `[` was a RecursionError traceback."""
    folder = tmp_path / "deep"
    shutil.copytree(tiny_vision_checkpoint, folder)
    (folder / "config.json").write_text(DEEP)
    args: list[str | Path] = [folder]
    if command == "convert-lucidrains":
        args = [folder / "model.safetensors", "--config", folder / "config.json", "--out", tmp_path / "o"]
    elif command in {"export", "inline"}:
        args += ["--out", tmp_path / "o"]
    line = one_line_error(run_gmlp(memory_cap, command, *args), command)
    assert "config.json" in line and ("nested more than 64 deep" in line or "unreadable config" in line)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (DEEP, "nested more than 64 deep"),
        ('{"0": "cat", "x": "dog"}', "labels must be a JSON list or an index"),
        ("\udcff not json", "not valid JSON"),
    ],
)
def test_malformed_labels_are_one_line(tmp_path: Path, memory_cap: int, content: str, expected: str) -> None:
    from model.lucidrains_import import _key_plan, lucidrains_config

    args = {"image_size": 8, "patch_size": 4, "num_classes": 2, "dim": 4, "depth": 1}
    plan = _key_plan(lucidrains_config(args), circulant=False)
    save_file({key: torch.zeros(shape) for key, _, shape in plan}, tmp_path / "w.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(args))
    (tmp_path / "labels.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    done = run_gmlp(
        memory_cap, "convert-lucidrains", tmp_path / "w.safetensors", "--config", tmp_path / "config.json",
        "--labels", tmp_path / "labels.json", "--out", tmp_path / "out",
    )  # fmt: skip
    assert expected in one_line_error(done, "convert-lucidrains")
