"""Large JPEGs: decoding at a reduced DCT scale vs decoding every pixel, for accuracy and cost.

    .venv/bin/python -m benchmarks.jpeg_draft --served models/cifar10-gmlp [--images 300] [--variant int8]

CIFAR-10 test images are upscaled (bicubic) to random sizes of 1 to 12 megapixels and saved as
JPEG (quality 90), as a phone photo of the same scene would arrive. Each is classified by the
served model (its int8 file by default, as the service runs it on CPU) twice: preprocessed from a
full decode, and from the reduced decode the service uses (`contract.image`: sides of at least
twice the resize target). Prints the top-1 agreement of the two and the median preprocessing
time of each on a 12-megapixel photo (the two timed in turn), with the CPU's model name and flags:
the measurement behind `GMLP_JPEG_DRAFT` (contract/image.py).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.harness import (
    add_cifar_argument,
    add_timing_arguments,
    command_line,
    cpu_line,
    interleaved_ms,
)
from contract.formats import VARIANT_FILES
from contract.image import ImageTransform, decode_image
from export.verify import session

MEGAPIXELS = (1, 12)


def photos(
    cifar: Path, count: int, seed: int = 0, megapixels: tuple[float, float] = MEGAPIXELS
) -> list[bytes]:
    """`count` CIFAR-10 test images (from the npz `cifar`) as JPEG photos of `megapixels` (4:3 or 3:4)."""
    data = np.load(cifar)
    blob, offsets = data["test_jpeg"], data["test_offsets"]
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.choice(len(offsets) - 1, count, replace=False):
        image = Image.open(io.BytesIO(blob[offsets[i] : offsets[i + 1]].tobytes())).convert("RGB")
        pixels = rng.uniform(*megapixels) * 1e6
        short, long = int((pixels * 3 / 4) ** 0.5), int((pixels * 4 / 3) ** 0.5)
        size = (long, short) if rng.random() < 0.5 else (short, long)
        buffer = io.BytesIO()
        image.resize(size, Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--served", type=Path, required=True, help="a served vision model directory")
    parser.add_argument("--images", type=int, default=300, help="photos to classify (default 300)")
    add_timing_arguments(parser, repeats=7)
    parser.add_argument("--variant", choices=("int8", "fp32"), default="int8")
    add_cifar_argument(parser)
    args = parser.parse_args()
    config = json.loads((args.served / "config.json").read_text())
    transform = ImageTransform.for_model(config, max_pixels=50_000_000)
    sess = session(args.served / VARIANT_FILES[args.variant], threads=args.threads)

    def full(data: bytes) -> np.ndarray:
        return transform.transform(decode_image(data, transform.max_pixels))

    agree = 0
    for data in photos(args.cifar, args.images):
        logits = sess.run(["logits"], {"pixel_values": np.stack([full(data), transform(data)])})[0]
        agree += int(logits[0].argmax() == logits[1].argmax())
    (twelve,) = photos(args.cifar, 1, seed=1, megapixels=(12, 12))
    ms = interleaved_ms({"full": lambda: full(twelve), "reduced": lambda: transform(twelve)}, args.repeats)
    full_ms, reduced_ms = ms["full"], ms["reduced"]
    print(cpu_line())
    print(
        f"top-1 agreement ({args.variant}), reduced vs full decode, {args.images} photos of 1-12 MP: "
        f"{100 * agree / args.images:.1f} %"
    )
    print(
        f"preprocessing one {_megapixels(twelve):.1f} MP photo (median of {args.repeats}): full decode "
        f"{full_ms:.1f} ms, reduced {reduced_ms:.1f} ms ({full_ms / reduced_ms:.1f}x)"
    )


def _megapixels(data: bytes) -> float:
    width, height = Image.open(io.BytesIO(data)).size
    return width * height / 1e6


if __name__ == "__main__":
    main()
