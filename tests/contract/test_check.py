"""The recorded check's tolerance: the variant's own, or the looser one of the precision a runtime
computes the variant in (OpenVINO's bf16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contract.check import run_check, write_check


def test_a_bf16_runtime_is_held_to_bf16s_bound_and_no_looser(tmp_path: Path) -> None:
    logits = np.linspace(-4.0, 4.0, 20, dtype=np.float32).reshape(2, 10)
    entry = write_check(
        tmp_path / "check.npz",
        {"c": {"x": np.zeros((2, 3), np.float32)}},
        {"fp32": {"c": {"logits": logits}}},
    )

    def replay(error: float, precision: str | None) -> str | None:
        moved = logits + error * np.abs(logits).max()  # every logit off by `error` of the largest
        return run_check(tmp_path, entry, "fp32", lambda _: {"logits": moved}, precision)

    assert replay(0.0, None) is None
    assert replay(0.02, None) is not None  # beyond fp32's 1e-3
    assert replay(0.02, "fp32") is not None
    assert replay(0.02, "bf16") is None  # bf16 rounds every product to 8 bits of mantissa
    failed = replay(0.1, "bf16")
    assert failed is not None and "differs from the export's recorded check" in failed
