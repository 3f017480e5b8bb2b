"""Precision choice for CPU training and benchmarks: bf16 autocast only where bf16 is native."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmlp.cli import build_parser
from gmlp.train_commands import PRECISIONS as CLI_PRECISIONS
from model.train.loop import PRECISIONS, native_bf16, resolve_precision


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="needs Linux /proc/cpuinfo")
def test_native_bf16_agrees_with_the_kernels_cpu_flags() -> None:
    # torch's own probe (or the fallback) against what the kernel reports for the CPU.
    flags_line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    flags = flags_line.split(":", 1)[1].split()
    assert native_bf16() == ("avx512_bf16" in flags or "amx_bf16" in flags)


def test_auto_takes_bf16_only_where_native_and_explicit_choices_stand() -> None:
    assert resolve_precision("auto") == ("bf16" if native_bf16() else "fp32")
    assert resolve_precision("fp32") == "fp32"
    assert resolve_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match="auto, bf16, fp32"):
        resolve_precision("fp16")


@pytest.mark.parametrize("command", ["train-vision", "train-mlm"])
def test_training_commands_default_to_auto_and_keep_no_bf16(command: str) -> None:
    parser = build_parser()
    assert CLI_PRECISIONS == PRECISIONS
    assert parser.parse_args([command]).precision == "auto"
    assert parser.parse_args([command, "--precision", "bf16"]).precision == "bf16"
    assert parser.parse_args([command, "--no-bf16"]).precision == "fp32"
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--precision", "fp16"])
