"""The CPU's feature flags, as Linux lists them in /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

from contract.cpu import cpu_flags


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\nbugs\t\t: spectre_v1\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()
