"""What bf16 autocast costs or buys per training step on this CPU, against fp32.

    .venv/bin/python -m benchmarks.train_precision [--threads 2] [--repeats 3]

bf16 autocast is fast only where the CPU computes bf16 natively (AVX512-BF16, AMX); elsewhere
oneDNN emulates it. This times one whole eager AdamW step of each committed demo model's
training shape both ways, in turn, and prints the medians and the ratio, with whether this CPU
has native bf16: the measurement behind `--precision auto` (model/precision.py).
"""

from __future__ import annotations

from benchmarks import training
from benchmarks.harness import interleaved_ms
from model import build_model
from model.precision import native_bf16


def main() -> None:
    args = training.parse_args(__doc__, repeats=3, precision=False)
    print(f"threads {args.threads}, native bf16: {native_bf16()}, median of {args.repeats}\n")
    print("| demo model (batch) | fp32 (ms) | bf16 autocast (ms) | bf16 / fp32 |")
    print("|---|---:|---:|---:|")
    for name, config, batch in training.demo_configs():
        steps = {
            precision: training.model_step(build_model(config).train(), batch, precision == "bf16")
            for precision in ("fp32", "bf16")
        }
        ms = interleaved_ms(steps, args.repeats)
        print(f"| {name} ({batch}) | {ms['fp32']:.0f} | {ms['bf16']:.0f} | {ms['bf16'] / ms['fp32']:.2f}x |")


if __name__ == "__main__":
    main()
