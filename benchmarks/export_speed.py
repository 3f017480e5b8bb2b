"""Model-level throughput: PyTorch eager fp32 and bf16 autocast vs ONNX Runtime (plain, fused, int8).

    .venv/bin/python -m benchmarks.export_speed gmlp_s16_224 --batches 1,8,32      # or: make bench
    .venv/bin/python -m benchmarks.export_speed checkpoints/cifar10-gmlp --batches 1,8,64 --min-seconds 0.5

The model is a checkpoint directory or a named config (random weights: fine for speed); it is
exported plain and fused, and quantised to dynamic and static int8, in a temporary directory.
Every figure is a median over several timed runs, and every row is also given as a ratio to
PyTorch eager fp32 measured in the same process moments before, which is what stays comparable
on a shared, noisy machine. The bf16 autocast row is measured only on CPUs with native bf16:
elsewhere it is emulated and no baseline anyone would deploy (model/precision.py).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from benchmarks.harness import command_line, cpu_line, median_rate
from contract.errors import UserError
from contract.formats import VISION_TASK
from export.onnx_export import example_inputs, export_onnx
from export.variants import quantize_int8
from export.verify import session
from model import GMLPModel, build_model, get_config, load_checkpoint
from model.precision import native_bf16

NO_BF16_NOTE = (
    "PyTorch bf16 autocast: not measured, this CPU has no native bf16 (AVX512-BF16/AMX), "
    "so autocast would be emulated (model/precision.py)"
)


def _load(path_or_name: str) -> GMLPModel:
    path = Path(path_or_name)
    if path.is_dir():
        return load_checkpoint(path)
    model = build_model(get_config(path_or_name))  # random weights: fine for speed
    return model.eval()


def run_bench(
    path_or_name: str,
    batches: list[int],
    *,
    repeats: int = 5,
    threads: int = 0,
    min_seconds: float = 1.0,
) -> str:
    """Benchmark and return a markdown table (throughput in samples/s and ratio to eager fp32)."""
    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    model = _load(path_or_name)
    config = model.config
    unit = "images/s" if config.task == VISION_TASK else "sequences/s"
    with_bf16 = native_bf16()
    with tempfile.TemporaryDirectory() as tmp:
        plain = export_onnx(model, Path(tmp) / "plain.onnx", fused=False)
        fused = export_onnx(model, Path(tmp) / "fused.onnx")
        dynamic, static = Path(tmp) / "dynamic.int8.onnx", Path(tmp) / "static.int8.onnx"
        quantize_int8(fused, dynamic)
        # Static int8 needs calibration inputs; for speed, random valid inputs do.
        calibration = [
            {k: v.numpy() for k, v in example_inputs(config, 1, seed=seed).items()} for seed in range(16)
        ]
        quantize_int8(fused, static, calibration)
        sessions = {
            name: session(p, threads=threads)
            for name, p in [
                ("ORT plain export fp32", plain),
                ("ORT fused fp32", fused),
                ("ORT fused int8 dynamic", dynamic),
                ("ORT fused int8 static (served on CPU)", static),
            ]
        }
        rows: dict[str, dict[int, float]] = {}
        for batch in batches:
            inputs = example_inputs(config, batch, seed=batch)
            feeds = {k: v.numpy() for k, v in inputs.items()}
            args = tuple(inputs.values())

            def eager(args: tuple[torch.Tensor, ...] = args) -> torch.Tensor:
                with torch.inference_mode():
                    return _forward(model, args)

            def bf16(args: tuple[torch.Tensor, ...] = args) -> torch.Tensor:
                with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
                    return _forward(model, args)

            candidates: dict[str, Callable[[], object]] = {"PyTorch eager fp32": eager}
            if with_bf16:
                candidates["PyTorch bf16 autocast"] = bf16
            for name, sess in sessions.items():
                candidates[name] = functools.partial(sess.run, ["logits"], feeds)
            for name, fn in candidates.items():
                rows.setdefault(name, {})[batch] = median_rate(
                    fn, batch, repeats=repeats, min_seconds=min_seconds
                )
    notes = [] if with_bf16 else [NO_BF16_NOTE]
    return _table(rows, batches, unit, path_or_name, threads, notes)


def _forward(model: nn.Module, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if len(args) == 2:  # masked LM: decode only the requested positions, as the served graph does
        return model(args[0], positions=args[1])
    return model(args[0])


def _table(
    rows: dict[str, dict[int, float]],
    batches: list[int],
    unit: str,
    what: str,
    threads: int,
    notes: list[str],
) -> str:
    base = rows["PyTorch eager fp32"]
    header = "| runtime | " + " | ".join(f"batch {b} ({unit})" for b in batches) + " |"
    lines = [
        cpu_line(),
        f"{what}, {threads} threads; median throughput, (x) = ratio to PyTorch eager fp32",
        "",
        header,
        "|---|" + "---|" * len(batches),
    ]
    for name, by_batch in rows.items():
        cells = [f"{by_batch[b]:.1f} ({by_batch[b] / base[b]:.2f}x)" for b in batches]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] * bool(notes) + notes)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    p = command_line(__doc__)
    p.add_argument(
        "path", help="checkpoint directory, served-model directory, or a named config (gmlp_s16_224)"
    )
    p.add_argument("--batches", type=_ints, default=[1, 8, 32], help="comma list (default 1,8,32)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    p.add_argument("--threads", type=int, default=0, help="threads for torch and ORT (0: all CPUs)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="minimum time per timed run")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as markdown here")
    args = p.parse_args(argv)
    try:
        table = run_bench(
            args.path, args.batches, repeats=args.repeats, threads=args.threads, min_seconds=args.min_seconds
        )
    except (UserError, FileNotFoundError) as exc:  # no such checkpoint or config: say which
        p.error(str(exc))
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
