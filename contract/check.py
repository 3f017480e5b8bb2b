"""The recorded check of a served-model directory: reference inputs and the outputs the export saw.

`gmlp export` runs every variant it writes on a few reference inputs (the graph contract's own
example inputs, at the batch and lengths a request can have) and stores inputs and outputs in
`check.npz`, named in config.json as `"check": {"file": "check.npz", "cases": [...]}`. Before the
service lets a version take traffic it runs the variant it chose on the same inputs and compares:
a graph whose answers moved since it was exported (a re-exported or retrained file under an old
config, a corrupted copy) is refused. Arrays are stored as `CASE/INPUT` and `VARIANT/CASE/OUTPUT`.

Float outputs are compared within a tolerance; the ids of the top-k outputs are equal to the
recorded ones except where the recorded scores are tied within that tolerance (rounding may then
order them either way), or at the last rank, whose runner-up was not recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.spec import confined, open_regular

CHECK_FILE = "check.npz"
# Outputs agree when max |got - recorded| <= ATOL + RTOL[variant] * max |recorded|: float graphs
# differ between CPUs only in rounding; quantised and half-precision kernels differ a little more
# between instruction sets; a runtime computing an fp32 graph in bf16 (OpenVINO on CPUs with bf16
# instructions) rounds every product to 8 bits of mantissa. Another model's answers miss by the size
# of the logits themselves.
ATOL = 1e-3
RTOL = {"fp32": 1e-3, "int8": 2e-2, "fp16": 2e-2, "bf16": 5e-2}

Arrays = dict[str, np.ndarray]


def write_check(path: Path, cases: Mapping[str, Arrays], outputs: Mapping[str, Mapping[str, Arrays]]) -> dict:
    """Write `check.npz` (cases: inputs by case; outputs: by variant, then case) and return the
    config.json entry that names it."""
    arrays = {f"{c}/{n}": a for c, feeds in cases.items() for n, a in feeds.items()}
    for v, by_case in outputs.items():
        arrays.update({f"{v}/{c}/{n}": a for c, out in by_case.items() for n, a in out.items()})
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy types **kwds as allow_pickle
    return {"file": path.name, "cases": sorted(cases), "variants": sorted(outputs)}


def run_check(
    directory: Path,
    entry: Mapping,
    variant: str,
    run: Callable[[Arrays], Arrays],
    precision: str | None = None,
) -> str | None:
    """Run `variant` (through `run`: batched graph inputs -> outputs) on the recorded inputs; None
    when it answers as recorded, else what differs. `precision`: what the runtime computes the
    graph in where that is not the variant's own (OpenVINO's bf16); the looser of the two
    tolerances applies. A variant the export did not record is a failure too: the check cannot
    vouch for it."""
    if variant not in entry.get("variants", []):
        return f"the recorded check has no outputs of variant {variant} (has {entry.get('variants')})"
    path = confined(directory, entry["file"], "check file")
    # A regular file only (a FIFO would block the load for good); its arrays are read here, while
    # the file is open.
    with open_regular(path, "check file", None) as handle, np.load(handle) as data:
        arrays = {k: data[k] for k in data.files}
    for case in entry.get("cases", []):
        prefix = f"{case}/"
        feeds = {k[len(prefix) :]: a for k, a in arrays.items() if k.startswith(prefix)}
        got = run(feeds)
        for key, expected in arrays.items():
            if not key.startswith(f"{variant}/{case}/"):
                continue
            name = key.rsplit("/", 1)[1]
            if name not in got or got[name].shape != expected.shape:
                shape = None if name not in got else got[name].shape
                return f"case {case}: output {name} has shape {shape}, recorded {expected.shape}"
            if name == TOP_K_IDS_OUTPUT:
                scores = arrays.get(f"{variant}/{case}/{TOP_K_SCORES_OUTPUT}")
                problem = _ids_differ(got[name], expected, scores, precision or variant)
                if problem is not None:
                    return f"case {case}: output {name} {problem}"
                continue
            diff = float(np.abs(got[name].astype(np.float64) - expected).max())
            allowed = max(_allowed(expected, variant), _allowed(expected, precision or variant))
            if diff > allowed:
                return (
                    f"case {case}: output {name} differs from the export's recorded check by "
                    f"{diff:.3g} (allowed {allowed:.3g})"
                )
    return None


def _allowed(expected: np.ndarray, variant: str) -> float:
    return ATOL + RTOL.get(variant, RTOL["fp16"]) * float(np.abs(expected).max())


def _ids_differ(got: np.ndarray, expected: np.ndarray, scores: np.ndarray | None, variant: str) -> str | None:
    """None when top-k ids equal the recorded ones wherever the recorded scores (best first) are
    not tied within the check's tolerance, else what differs."""
    if scores is None or scores.shape != expected.shape:
        return "was recorded without its scores"
    k = expected.shape[-1]
    rows, recorded = got.reshape(-1, k), expected.reshape(-1, k)
    ranked = scores.reshape(-1, k).astype(np.float64)
    allowed = _allowed(scores, variant)
    gaps = np.abs(np.diff(ranked, axis=1)) <= allowed  # rank j tied with rank j + 1
    tied = np.zeros(ranked.shape, dtype=bool)
    tied[:, 1:] |= gaps
    tied[:, :-1] |= gaps
    tied[:, -1] = True
    differ = (rows != recorded) & ~tied
    if differ.any():
        row, rank = (int(x[0]) for x in np.nonzero(differ))
        return (
            f"names id {int(rows[row, rank])} at rank {rank} of row {row}, the export recorded "
            f"{int(recorded[row, rank])} (not tied within {allowed:.3g})"
        )
    return None
