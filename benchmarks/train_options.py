"""What the training loop's options buy per optimiser step on CPU: fused AdamW and `--compile`.

    python scripts/bench_train_options.py [--threads 2] [--repeats 7]

For each committed demo model's shape (read from `checkpoints/*/config.json`) this times a whole
step (forward + backward in the precision `gmlp train-*` picks for this CPU, `--precision` to
override; AdamW built as `gmlp train-*` builds it) three ways:
eager with torch's default (per-tensor loop) AdamW, eager with fused AdamW (the loop's default),
and `torch.compile`d with fused AdamW (`--compile`). Medians over `--repeats` runs, the variants
timed in turn; ratios are what stays comparable on a shared machine. A benchmark, not a test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_train_step import _interleaved_ms, _model_step, bench_args  # noqa: E402

from model import GMLPConfig, build_model, config_from_dict  # noqa: E402
from model.train.loop import LoopConfig, build_optimizer  # noqa: E402

DEMOS = {"cifar10-gmlp": 128, "gutenberg-gmlp-mlm": 48}  # checkpoint -> training batch size


def demo_configs() -> list[tuple[str, GMLPConfig, int]]:
    """(name, model config, training batch size) of each committed demo checkpoint."""
    return [
        (
            name,
            config_from_dict(json.loads((ROOT / "checkpoints" / name / "config.json").read_text())["model"]),
            batch,
        )
        for name, batch in DEMOS.items()
    ]


def main() -> None:
    args = bench_args(__doc__, repeats=7)
    print(f"threads {args.threads}, {args.precision_label}, median of {args.repeats}\n")
    print("| demo model (batch) | eager, loop AdamW (ms) | eager, fused AdamW (ms) | compiled, fused (ms) |")
    print("|---|---:|---:|---:|")
    for name, config, batch in demo_configs():
        steps = {}
        for key, fused, compiled in (
            ("loop", False, False),
            ("fused", True, False),
            ("compiled", True, True),
        ):
            model = build_model(config).train()
            opt = build_optimizer(
                model, LoopConfig(lr=1e-4, weight_decay=0.01, warmup_steps=0, fused_optimizer=fused)
            )
            steps[key] = _model_step(model, batch, args.bf16, opt, torch.compile(model) if compiled else None)
        ms = _interleaved_ms(steps, args.repeats)
        cells = [f"{ms['loop']:.0f}"] + [
            f"{ms[k]:.0f} ({ms['loop'] / ms[k]:.2f}x)" for k in ("fused", "compiled")
        ]
        print(f"| {name} ({batch}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
