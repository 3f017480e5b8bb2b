"""CUDA checks for the served models: CUDA-EP parity against CPU, and throughput of CPU vs CUDA fp32
vs CUDA fp16, each run by the service's own `OnnxModel` (on CUDA with IO binding, as served). Part
of scripts/gpu-check.sh; needs only the serving install with onnxruntime-gpu, run from the checkout:

    python -m benchmarks.gpu --models models --out OUT [--batches 1,8,64] [--seconds 2]

Writes OUT/gpu-bench.json and OUT/gpu-bench.md (with the machine's CPU line). Without a CUDA
provider it still runs the CPU rows and says that CUDA was not available.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import command_line, cpu_line, median_seconds
from contract.formats import VISION_TASK
from service.engine.runtime import OnnxModel, RuntimeOptions, cuda_available


def make_inputs(cfg: dict, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs of `batch` rows; a masked LM's named axes at their largest (the full window
    of `seq_len` tokens, every prediction slot), the costliest shape a request can have."""
    sizes: dict[str, Any] = {
        "batch": batch,
        "seq": cfg.get("seq_len"),
        "predictions": cfg.get("max_predictions"),
    }
    feeds: dict[str, np.ndarray] = {}
    for spec in cfg["inputs"]:
        shape = (batch, *(int(d if isinstance(d, int) else sizes[d]) for d in spec["shape"][1:]))
        if spec["dtype"] == "float32":
            feeds[spec["name"]] = rng.standard_normal(shape, dtype=np.float32)
        elif spec["name"] == "input_ids":
            feeds[spec["name"]] = rng.integers(1000, cfg["vocab_size"], shape, dtype=np.int64)
        else:  # mask_positions
            feeds[spec["name"]] = rng.integers(0, cfg["seq_len"], shape, dtype=np.int64)
    return feeds


def throughput(model: OnnxModel, feeds: dict[str, np.ndarray], batch: int, seconds: float) -> float:
    """Items/s at the median call's time over `seconds`, after 3 untimed calls."""
    return batch / median_seconds(lambda: model.run(feeds, ["logits"]), seconds, warmups=3)


def bench_model(model_dir: Path, batches: list[int], seconds: float) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    rng = np.random.default_rng(0)
    has_cuda = cuda_available()
    runs = [("cpu", "fp32"), ("cpu", "int8")] + ([("cuda", "fp32"), ("cuda", "fp16")] if has_cuda else [])
    rows = {
        f"{device.upper()} {variant}": OnnxModel(
            model_dir / cfg["variants"][variant], RuntimeOptions(device, os.cpu_count() or 1)
        )
        for device, variant in runs
        if variant in cfg["variants"]
    }
    result: dict = {"model": cfg["name"], "task": cfg["task"], "cuda_available": has_cuda, "parity": {}}
    check = make_inputs(cfg, 8, rng)
    reference = rows["CPU fp32"].run(check, ["logits"])["logits"]
    for name, model in rows.items():
        if name == "CPU fp32":
            continue
        got = model.run(check, ["logits"])["logits"]
        result["parity"][name] = {
            "provider": model.provider,
            "max_abs_diff_vs_cpu_fp32": float(np.abs(got - reference).max()),
            "top1_agreement": float((got.argmax(-1) == reference.argmax(-1)).mean()),
        }
    result["throughput"] = {
        name: {str(b): throughput(model, make_inputs(cfg, b, rng), b, seconds) for b in batches}
        for name, model in rows.items()
    }
    return result


def to_markdown(results: list[dict], batches: list[int], machine: str) -> str:
    lines = [machine, ""]
    for res in results:
        unit = "images/s" if res["task"] == VISION_TASK else "sequences/s"
        lines += [
            f"### {res['model']} ({unit}, median)",
            "",
            "| runtime | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|" + "---|" * len(batches),
        ]
        for name, by_batch in res["throughput"].items():
            lines.append(f"| {name} | " + " | ".join(f"{by_batch[str(b)]:.1f}" for b in batches) + " |")
        lines.append("")
        for name, p in res["parity"].items():
            lines.append(
                f"- {name} on {p['provider']}: max |diff| vs CPU fp32 {p['max_abs_diff_vs_cpu_fp32']:.2e}, "
                f"top-1 agreement {100 * p['top1_agreement']:.1f}%"
            )
        if not res["cuda_available"]:
            lines.append("- CUDA execution provider NOT available: only CPU rows were measured")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dirs = sorted(p.parent for p in args.models.glob("*/config.json"))
    results = [bench_model(d, batches, args.seconds) for d in dirs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-bench.json").write_text(json.dumps(results, indent=2))
    text = to_markdown(results, batches, cpu_line())
    (args.out / "gpu-bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
