"""What the training loop's options buy per optimiser step on CPU: fused AdamW and `--compile`.

    .venv/bin/python -m benchmarks.train_options [--threads 2] [--repeats 7]

For each committed demo model's shape (read from `checkpoints/*/config.json`) this times a whole
step (forward + backward in the precision `gmlp train-*` picks for this CPU, `--precision` to
override; AdamW built as `gmlp train-*` builds it) three ways:
eager with torch's default (per-tensor loop) AdamW, eager with fused AdamW (the loop's default),
and `torch.compile`d with fused AdamW (`--compile`). Medians over `--repeats` runs, the variants
timed in turn; ratios are what stays comparable on a shared machine. It is the measurement behind
the training loop's defaults (model/train/loop.py).
"""

from __future__ import annotations

import torch

from benchmarks import training
from benchmarks.harness import interleaved_ms
from model import build_model
from model.train.loop import LoopConfig, build_optimizer


def main() -> None:
    args = training.parse_args(__doc__, repeats=7)
    print(f"threads {args.threads}, {args.precision_label}, median of {args.repeats}\n")
    print("| demo model (batch) | eager, loop AdamW (ms) | eager, fused AdamW (ms) | compiled, fused (ms) |")
    print("|---|---:|---:|---:|")
    for name, config, batch in training.demo_configs():
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
            steps[key] = training.model_step(
                model, batch, args.bf16, opt, torch.compile(model) if compiled else None
            )
        ms = interleaved_ms(steps, args.repeats)
        cells = [f"{ms['loop']:.0f}"] + [
            f"{ms[k]:.0f} ({ms['loop'] / ms[k]:.2f}x)" for k in ("fused", "compiled")
        ]
        print(f"| {name} ({batch}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
