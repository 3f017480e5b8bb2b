"""Which CPU precision to compute in: bf16 autocast only where the CPU does bf16 natively.

bf16 autocast pays only on CPUs with native bf16 arithmetic (AVX512-BF16 or AMX). Elsewhere oneDNN
emulates it, many times slower than fp32 (docs/benchmarks.md, "Precision on CPUs without bf16").
So `auto`, the training commands' default, picks bf16 only where it is native, and a forced
`bf16` on other CPUs is logged as the slow path it is.
"""

from __future__ import annotations

import logging

from contract.cpu import BF16_FLAGS, PRECISIONS, cpu_flags
from contract.errors import UserError

log = logging.getLogger(__name__)


def native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16), by the flags the
    service's backends read too."""
    return bool(cpu_flags() & BF16_FLAGS)


def precision_label(bf16: bool) -> str:
    """How a run's precision is recorded (training.json, model cards, benchmark tables)."""
    return "bf16 autocast" if bf16 else "fp32"


def resolve_precision(choice: str) -> str:
    """'auto' -> 'bf16' or 'fp32' for this CPU; 'bf16' and 'fp32' are returned as asked."""
    if choice not in PRECISIONS:
        raise UserError(f"precision {choice!r}; choose from {', '.join(PRECISIONS)}")
    native = native_bf16()
    if choice == "auto":
        return "bf16" if native else "fp32"
    if choice == "bf16" and not native:
        log.warning(
            "bf16 autocast asked for, but this CPU has no native bf16 (AVX512-BF16/AMX): "
            "it is emulated and can be an order of magnitude slower than fp32"
        )
    return choice
