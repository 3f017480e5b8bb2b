"""Which static int8 scheme the CPU serves well: accuracy and speed of the committed CIFAR-10 demo.

    .venv/bin/python -m benchmarks.int8_schemes [--threads 2] [--repeats 7] [--limit 10000]

ONNX Runtime's x86 int8 GEMM multiplies u8 activations by s8 weights. With AVX512-VNNI it
accumulates in int32; without it (AVX2, plain AVX-512) it uses VPMADDUBSW, which adds pairs of
products in int16 and saturates. This exports `checkpoints/cifar10-gmlp` once, quantises it four
ways (u8 x s8 with 8-bit weights, u8 x s8 with 7-bit weights as `gmlp export` writes, u8 x u8, s8 x s8),
all with the same 256 calibration images, and reports CIFAR-10 test top-1 and the median time of
a batch of 32 for each beside fp32, the files timed in turn, with the machine's flags, which
decide the result: the measurement behind the 7-bit weights of `gmlp export` (export/variants.py).
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from onnxruntime.quantization import QuantType, quantize_static

from benchmarks.harness import (
    REPO,
    add_cifar_argument,
    add_timing_arguments,
    command_line,
    cpu_line,
    interleaved_ms,
)
from contract.formats import VARIANT_FILES
from export.directory import calibration_feeds, export_served_model
from export.variants import STATIC_INT8_OPTIONS, FeedsReader
from export.verify import session
from gmlp.train_commands import CACHE_DIR
from model.train.evaluate import evaluate_classifier, open_predictor

# Changes to the export's static settings (STATIC_INT8_OPTIONS with 8-bit weights).
SCHEMES = {
    "u8 x s8 (8-bit weights)": {},
    "u8 x s8, 7-bit weights (gmlp export)": {"reduce_range": True},
    "u8 x u8": {"weight_type": QuantType.QUInt8},
    "s8 x s8": {"activation_type": QuantType.QInt8},
}


def main() -> None:
    parser = command_line(__doc__)
    add_timing_arguments(parser, repeats=7)
    parser.add_argument("--limit", type=int, default=None, help="test images (default all 10,000)")
    add_cifar_argument(parser)
    args = parser.parse_args()
    checkpoint = REPO / "checkpoints" / "cifar10-gmlp"
    print(cpu_line())
    print(f"threads {args.threads}; median of {args.repeats}\n")
    print("| int8 scheme | CIFAR-10 test top-1 | ms per batch of 32 (x fp32) |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "cifar10-gmlp"
        export_served_model(checkpoint, served, ["fp32"])
        config_path = served / "config.json"
        config = json.loads(config_path.read_text())
        config["variants"]["int8"] = VARIANT_FILES["int8"]  # each scheme is scored as the int8 variant
        config_path.write_text(json.dumps(config))
        _, calibration = calibration_feeds(None, config, checkpoint, 256)
        if not calibration:
            raise SystemExit(f"{checkpoint} has no calibration set to quantise with")
        batch = {k: np.concatenate([f[k] for f in calibration[:32]]) for k in calibration[0]}
        fp32 = served / VARIANT_FILES["fp32"]
        candidates = {"fp32 (no quantisation)": fp32}
        for name, kwargs in SCHEMES.items():
            path = served / f"{len(candidates)}.onnx"
            options = {**STATIC_INT8_OPTIONS, "reduce_range": False, **kwargs}
            quantize_static(str(fp32), str(path), FeedsReader(calibration), **options)
            candidates[name] = path
        top1 = {}
        for name, path in candidates.items():
            shutil.copyfile(path, served / VARIANT_FILES["int8"])
            predictor = open_predictor(served, "int8", threads=args.threads)
            top1[name] = evaluate_classifier(predictor, args.cifar, args.limit, CACHE_DIR / "data")["top1"]
        # Timed in turn (fp32, scheme 1, ..., fp32, ...), so drift in the machine's speed hits all alike.
        sessions = {name: session(path, threads=args.threads) for name, path in candidates.items()}
        ms = interleaved_ms(
            {name: functools.partial(sess.run, None, batch) for name, sess in sessions.items()}, args.repeats
        )
        base = ms["fp32 (no quantisation)"]
        for name in candidates:
            print(f"| {name} | {100 * top1[name]:.2f} % | {ms[name]:.1f} ({base / ms[name]:.2f}x) |")


if __name__ == "__main__":
    main()
