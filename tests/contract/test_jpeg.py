"""Plain JPEGs decoded by libjpeg-turbo directly give Pillow's pixels; the rest still go to Pillow.

The reference for every comparison is Pillow's own decode (`contract.image.load_image`, with its
`draft` DCT scaling), which the fast path must reproduce byte for byte.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from contract.errors import InputTooLarge, InvalidInput
from contract.image import ImageTransform, PlainJpeg, load_image, open_image

pytestmark = pytest.mark.timeout(60)

MAX_PIXELS = 20_000_000
# A 224-pixel model: resize the shorter side to 256, centre crop 224 (timm's default eval).
IMAGENET_PRE = {"crop_size": 224, "resize_size": 256, "interpolation": "bicubic"}
CIFAR_PRE = {"crop_size": 32, "resize_size": 32, "interpolation": "bilinear"}


def photo(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """Smooth content with noise, like a photo: enough detail for scaled decoding to matter."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    noisy = np.clip(np.asarray(img, np.int16) + rng.integers(-20, 21, (height, width, 3)), 0, 255)
    return Image.fromarray(noisy.astype(np.uint8)).convert(mode)


def jpeg(img: Image.Image, **kw: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", **{"quality": 90, **kw})
    return buffer.getvalue()


CASES = {
    "cifar-size": jpeg(photo(32, 32)),
    "odd-size-444": jpeg(photo(53, 37, 1), subsampling=0),
    "422": jpeg(photo(300, 200, 2), subsampling=1),
    "progressive": jpeg(photo(640, 480, 3), progressive=True),
    "greyscale": jpeg(photo(500, 700, 4, mode="L")),
    "photo-2mp": jpeg(photo(1700, 1200, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("pre", [CIFAR_PRE, IMAGENET_PRE], ids=["32px", "224px"])
def test_plain_jpeg_matches_pillow_exactly(name: str, pre: dict[str, object]) -> None:
    data = CASES[name]
    t = ImageTransform.from_config(pre, MAX_PIXELS)
    opened = t.open(data)
    assert isinstance(opened, PlainJpeg)
    reference = t.transform(load_image(open_image(data, MAX_PIXELS), MAX_PIXELS, min_side=t.decode_side))
    np.testing.assert_array_equal(t.finish(opened), reference)


# 1700 x 1200: 1/8 keeps 212 x 150, 1/4 keeps 425 x 300, 1/2 850 x 600. At 700 px Pillow decodes it
# all, where libjpeg-turbo's own choice would be 5/8.
@pytest.mark.parametrize(
    ("min_side", "height"), [(None, 1200), (64, 150), (150, 150), (448, 600), (700, 1200)]
)
def test_scaled_decode_is_pillows_draft(min_side: int | None, height: int) -> None:
    data = CASES["photo-2mp"]
    plain = PlainJpeg.read(data)
    assert plain is not None and (plain.width, plain.height) == (1700, 1200)
    pixels = plain.decode(min_side)
    reference = np.asarray(load_image(open_image(data, MAX_PIXELS), MAX_PIXELS, min_side=min_side))
    assert pixels.shape == reference.shape == (height, -(-1700 * height // 1200), 3)
    np.testing.assert_array_equal(pixels, reference)


def test_exif_and_cmyk_jpegs_go_to_pillow() -> None:
    """Pillow applies EXIF orientation (test_image.py checks the pixels) and converts CMYK."""
    img = photo(40, 30)
    exif = img.getexif()
    exif[0x0112] = 6
    t = ImageTransform.from_config(CIFAR_PRE, MAX_PIXELS)
    for data in (jpeg(img, exif=exif), jpeg(Image.new("CMYK", (40, 40), (0, 255, 255, 0)))):
        assert PlainJpeg.read(data) is None
        assert isinstance(t.open(data), Image.Image)
    assert PlainJpeg.read(jpeg(img)) is not None


def test_truncated_and_oversized_plain_jpegs_are_client_errors() -> None:
    t = ImageTransform.from_config(CIFAR_PRE, MAX_PIXELS)
    data = CASES["progressive"]
    with pytest.raises(InvalidInput) as info:
        t(data[: len(data) // 2])
    assert info.value.code == "invalid_image" and "truncated or corrupt" in info.value.message
    small = ImageTransform.from_config(CIFAR_PRE, 100_000)
    with pytest.raises(InputTooLarge) as too_large:
        small.open(CASES["photo-2mp"])
    assert too_large.value.code == "image_too_large"
    assert PlainJpeg.read(b"\xff\xd8 not a jpeg at all") is None
    with pytest.raises(InvalidInput):
        t(b"\xff\xd8 not a jpeg at all")
