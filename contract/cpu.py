"""What the CPU computes natively: its feature flags, and the names precisions are reported by.

bf16 pays only on CPUs with native bf16 arithmetic (AVX512-BF16 or AMX); elsewhere it is emulated
(PyTorch's oneDNN) or replaced by fp32 (OpenVINO's CPU plugin). Training, export and the service
choose by the same flags (docs/benchmarks.md, "Precision on CPUs without bf16"; docs/deploy.md,
"Backends").
"""

from __future__ import annotations

from pathlib import Path

# CPU flags (Linux /proc/cpuinfo names) of the native bf16 instructions.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# The training commands' `--precision` choices (model/train/loop.py resolves `auto`).
PRECISIONS = ("auto", "bf16", "fp32")
# OpenVINO's element types -> the names precisions are reported by.
OPENVINO_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags of this machine's CPU as Linux lists them; empty where it does not."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    flags = next((line.split(":", 1)[1] for line in lines if line.startswith("flags")), "")
    return frozenset(flags.split())
