"""Image decoding and the eval transform, on real images made with Pillow and real CIFAR JPEGs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from contract.errors import InputTooLarge, InvalidInput, RequestError
from contract.image import ImageTransform, load_image, open_image, to_rgb

pytestmark = pytest.mark.timeout(60)

# The demo classifier's transform: 32x32, no resize for 32-px images, mean = std = 0.5.
CIFAR_PRE = {
    "crop_size": 32,
    "resize_size": 32,
    "interpolation": "bicubic",
    "mean": [0.5] * 3,
    "std": [0.5] * 3,
}
MAX_PIXELS = 1_000_000


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def transform() -> ImageTransform:
    return ImageTransform.from_config(CIFAR_PRE, MAX_PIXELS, (32, 32))


def test_cifar_jpeg_gives_normalised_chw(cifar_images: list[bytes]) -> None:
    out = transform()(cifar_images[0])
    assert out.shape == (3, 32, 32) and out.dtype == np.float32
    expected = (
        np.asarray(Image.open(io.BytesIO(cifar_images[0])).convert("RGB"), np.float32) / 255 - 0.5
    ) / 0.5
    np.testing.assert_allclose(out, expected.transpose(2, 0, 1), atol=1e-6)


def test_each_channel_is_normalised_with_its_own_mean_and_std() -> None:
    """ImageNet's statistics differ per channel: plane c of the answer is pixel channel c scaled by
    mean[c] and std[c], to the bit what the same arithmetic over [H, W, 3] pixels gives."""
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    config = {"crop_size": 32, "resize_size": 32, "mean": mean, "std": std}
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = ImageTransform.from_config(config, MAX_PIXELS, (32, 32))(encode(Image.fromarray(pixels), "PNG"))
    assert out.shape == (3, 32, 32) and out.dtype == np.float32 and out.flags.c_contiguous
    for c in range(3):
        plane = (pixels[..., c].astype(np.float32) / 255.0 - np.float32(mean[c])) / np.float32(std[c])
        np.testing.assert_array_equal(out[c], plane)


def test_shorter_side_resize_and_centre_crop() -> None:
    # 64 wide x 32 high, three vertical bands: red | green (columns 16..47) | blue.
    arr = np.zeros((32, 64, 3), np.uint8)
    arr[:, :16, 0] = 255
    arr[:, 16:48, 1] = 255
    arr[:, 48:, 2] = 255
    out = transform()(encode(Image.fromarray(arr), "PNG"))
    # Shorter side already 32: no resize; the centre crop keeps exactly the green band.
    np.testing.assert_array_equal(out[0], -1.0)
    np.testing.assert_array_equal(out[1], 1.0)
    np.testing.assert_array_equal(out[2], -1.0)


def test_resize_size_from_crop_pct_and_interpolation() -> None:
    t = ImageTransform.from_config(
        {"crop_size": 224, "crop_pct": 0.875, "interpolation": "bilinear"}, MAX_PIXELS
    )
    assert t.resize_size == 256 and t.crop_size == (224, 224)
    out = t(encode(Image.new("RGB", (640, 480), (255, 255, 255)), "JPEG", quality=95))
    assert out.shape == (3, 224, 224)
    np.testing.assert_allclose(out, 1.0, atol=0.02)
    with pytest.raises(ValueError, match="interpolation"):
        ImageTransform.from_config({"crop_size": 32, "interpolation": "cubic-ish"}, MAX_PIXELS)
    with pytest.raises(ValueError, match="does not match"):
        ImageTransform.from_config({"crop_size": 32}, MAX_PIXELS, (64, 64))


def test_large_jpegs_decode_at_a_reduced_dct_scale(cifar_images: list[bytes]) -> None:
    limit = 10_000_000
    t = ImageTransform.from_config({"crop_size": 32, "resize_size": 32}, limit)
    for i, size in enumerate([(2000, 1500), (1200, 1600), (900, 700)]):
        photo = Image.open(io.BytesIO(cifar_images[i])).convert("RGB").resize(size, Image.Resampling.BICUBIC)
        data = encode(photo, "JPEG", quality=90)
        reduced = load_image(open_image(data, limit), limit, min_side=64)
        # The smallest of 1/2, 1/4, 1/8 that keeps both sides >= 64.
        scale = max(f for f in (1, 2, 4, 8) if min(size) / f >= 64)
        assert reduced.size == tuple(-(-side // scale) for side in size) and reduced.mode == "RGB"
        full = t.transform(load_image(open_image(data, limit), limit))
        drafted = t(data)  # what the service runs: decoded at >= twice the resize target
        # The same picture, up to the resampling of two different decode sizes (normalised units).
        assert float(np.abs(drafted - full).mean()) < 0.05
    small = load_image(open_image(cifar_images[0], limit), limit, min_side=64)  # never upscaled
    assert small.size == (32, 32)
    png = encode(photo, "PNG")  # other formats are decoded whole
    assert load_image(open_image(png, limit), limit, min_side=64).size == photo.size


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])  # a JPEG with EXIF is decoded by Pillow, not libjpeg-turbo
def test_exif_orientation_is_honoured(fmt: str) -> None:
    # Stored 32 wide x 64 high, red on top, blue below; orientation 6 = display rotated 90 degrees
    # clockwise, so the displayed image is 64 x 32 with blue on the left and red on the right.
    arr = np.zeros((64, 32, 3), np.uint8)
    arr[:32, :, 0] = 255
    arr[32:, :, 2] = 255
    img = Image.fromarray(arr)
    exif = img.getexif()
    exif[0x0112] = 6
    out = transform()(encode(img, fmt, exif=exif, **({"quality": 100} if fmt == "JPEG" else {})))
    # (JPEG is lossy: within a few levels of pure colours.)
    assert out[2, :, 0].min() > 0.95 and out[0, :, 0].max() < -0.95  # left column blue
    assert out[0, :, 31].min() > 0.95 and out[2, :, 31].max() < -0.95  # right column red


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
def test_accepted_formats(fmt: str) -> None:
    img = Image.new("RGB", (40, 36), (200, 100, 50))
    out = transform()(encode(img, fmt, **({"quality": 100} if fmt in ("JPEG", "WEBP") else {})))
    assert out.shape == (3, 32, 32)
    # GIF is palette-quantised, JPEG/WebP lossy: colours within a few levels.
    np.testing.assert_allclose(out[:, 16, 16], (np.array([200, 100, 50]) / 255 - 0.5) / 0.5, atol=0.05)


def _float_scaled(arr: np.ndarray, sixteen: bool) -> np.ndarray:
    """The 16-bit scaling in floating point: rint(x / 257) (or x) clipped to 0..255."""
    wide = arr.astype(np.float64)
    scale = 257.0 if sixteen or wide.max(initial=0) > 255 else 1.0
    return np.clip(np.rint(wide / scale), 0, 255).astype(np.uint8)


def test_deep_greyscale_is_scaled_in_integers_exactly_as_in_floating_point() -> None:
    """Every 16-bit value, and 32-bit integers (negative, large, within 8 bits), give the pixels
    the floating-point formula gives, at a fraction of the memory."""
    every = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    assert np.array_equal(np.asarray(to_rgb(Image.fromarray(every)))[..., 0], _float_scaled(every, True))
    rng = np.random.default_rng(0)
    wide = rng.integers(-(2**31), 2**31 - 1, size=(64, 64), dtype=np.int64).astype(np.int32)
    wide[0, :4] = [-(2**31), 2**31 - 1, 0, 255]
    narrow = rng.integers(-300, 256, size=(64, 64)).astype(np.int32)
    for arr in (wide, narrow):
        got = np.asarray(to_rgb(Image.fromarray(arr, mode="I")))[..., 0]
        assert np.array_equal(got, _float_scaled(arr, False))


def _modes(rng: np.random.Generator) -> list[Image.Image]:
    """Images of random pixels in every mode whose conversion runs in bands."""
    rgba = Image.fromarray(rng.integers(0, 256, (37, 53, 4), dtype=np.uint8))
    palette = Image.fromarray(rng.integers(0, 256, (37, 53), dtype=np.uint8)).convert("P")
    palette.info["transparency"] = 7
    grey = Image.fromarray(rng.integers(0, 256, (37, 53), dtype=np.uint8))
    grey.info["transparency"] = 200
    deep = Image.fromarray(rng.integers(0, 65536, (37, 53), dtype=np.uint16))
    wide = Image.fromarray(rng.integers(-(2**20), 2**20, (37, 53)).astype(np.int32), mode="I")
    return [rgba, rgba.convert("LA"), palette, grey, deep, wide]


def test_conversions_in_bands_give_the_pixels_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import contract.image as image

    for img in _modes(np.random.default_rng(1)):
        whole = np.asarray(to_rgb(img.copy()))
        monkeypatch.setattr(image, "BAND_PIXELS", 53 * 5)  # bands of 5 rows, the last one of 2
        banded = np.asarray(to_rgb(img.copy()))
        monkeypatch.undo()
        assert np.array_equal(banded, whole), img.mode


def test_modes_are_brought_to_rgb() -> None:
    grey = load_image(open_image(encode(Image.new("L", (8, 8), 128), "PNG"), MAX_PIXELS), MAX_PIXELS)
    assert grey.mode == "RGB" and grey.getpixel((0, 0)) == (128, 128, 128)
    # 16-bit greyscale is scaled (65535 -> 255), not clipped.
    deep = Image.fromarray(np.full((8, 8), 32896, np.uint16))
    assert load_image(open_image(encode(deep, "PNG"), MAX_PIXELS), MAX_PIXELS).getpixel((0, 0)) == (
        128,
        128,
        128,
    )
    # Transparent pixels are shown over white.
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    assert load_image(open_image(encode(rgba, "PNG"), MAX_PIXELS), MAX_PIXELS).getpixel((0, 0)) == (
        255,
        255,
        255,
    )
    half = Image.new("RGBA", (8, 8), (0, 0, 255, 128))
    r, g, b = load_image(open_image(encode(half, "PNG"), MAX_PIXELS), MAX_PIXELS).getpixel((0, 0))
    assert b == 255 and 120 <= r == g <= 130
    palette = Image.new("P", (8, 8), 3)
    palette.putpalette([0, 0, 0] * 3 + [10, 20, 30] + [0, 0, 0] * 252)
    assert load_image(open_image(encode(palette, "PNG"), MAX_PIXELS), MAX_PIXELS).getpixel((0, 0)) == (
        10,
        20,
        30,
    )
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # pure red in CMYK
    r, g, b = load_image(open_image(encode(cmyk, "JPEG", quality=100), MAX_PIXELS), MAX_PIXELS).getpixel(
        (0, 0)
    )
    assert r > 240 and g < 15 and b < 15
    bilevel = Image.new("1", (8, 8), 1)
    assert load_image(open_image(encode(bilevel, "BMP"), MAX_PIXELS), MAX_PIXELS).getpixel((0, 0)) == (
        255,
        255,
        255,
    )


def test_animated_gif_uses_the_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    r, g, b = load_image(open_image(data, MAX_PIXELS), MAX_PIXELS).getpixel((0, 0))
    assert r > 240 and b < 15


def _error(data: bytes, max_pixels: int = MAX_PIXELS) -> RequestError:
    with pytest.raises(RequestError) as info:
        load_image(open_image(data, max_pixels), max_pixels)
    return info.value


def test_bad_images_are_client_errors(cifar_images: list[bytes]) -> None:
    assert _error(b"").code == "empty_image"
    assert isinstance(_error(b"this is not an image"), InvalidInput)
    tiff = encode(Image.new("RGB", (8, 8)), "TIFF")
    err = _error(tiff)
    assert isinstance(err, InvalidInput) and "JPEG, PNG, WebP, GIF or BMP" in err.message
    # A JPEG cut in the middle of its scan data: a decode error, not grey padding.
    big = encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)), "JPEG")
    err = _error(big[: len(big) // 2])
    assert isinstance(err, InvalidInput) and err.code == "invalid_image"
    assert isinstance(_error(cifar_images[0][:100]), InvalidInput)


def test_decompression_bombs_are_refused_before_decoding() -> None:
    # 2000 x 2000 one-bit PNG: a few KB on the wire, 4 M pixels once decoded.
    bomb = encode(Image.new("1", (2000, 2000)), "PNG")
    assert len(bomb) < 10_000
    err = _error(bomb, max_pixels=1_000_000)
    assert isinstance(err, InputTooLarge) and err.code == "image_too_large" and "1000000" in err.message
    # Beyond Pillow's own process-wide limit its DecompressionBombError is mapped the same way.
    limit = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = 1_000_000
        err = _error(bomb, max_pixels=10_000_000)
        assert isinstance(err, InputTooLarge) and err.code == "image_too_large"
    finally:
        Image.MAX_IMAGE_PIXELS = limit


@pytest.mark.parametrize(("size", "fmt"), [((65000, 1), "PNG"), ((1, 65000), "PNG"), ((20000, 8), "JPEG")])
def test_an_elongated_image_is_refused_from_its_header(size: tuple[int, int], fmt: str) -> None:
    """A line of a few hundred bytes would resize to millions of pixels before the crop: refused
    from the header (`finish`, the decode, is never reached), with the limit and the aspect ratio."""
    t = ImageTransform.from_config(CIFAR_PRE, MAX_PIXELS, (32, 32), max_resized_pixels=100_000)
    data = encode(Image.new("RGB", size, (10, 20, 30)), fmt)
    assert len(data) < 20_000 and size[0] * size[1] <= MAX_PIXELS
    new_w, new_h = t.resized_size(*size)
    assert new_w * new_h > 100_000  # what the resize would have made of it
    with pytest.raises(InputTooLarge) as err:
        t.open(data)
    assert err.value.code == "image_too_large"
    assert f"{new_w}x{new_h}" in err.value.message and "100000" in err.value.message
    assert f"{100_000 // 32**2}:1" in err.value.message


def test_a_header_without_pixels_is_an_invalid_image() -> None:
    for size in ((0, 5), (5, 0), (0, 0)):
        with pytest.raises(InvalidInput) as err:
            transform().check_resized(*size)
        assert err.value.code == "invalid_image"


def test_the_resize_bound_is_exact_at_the_limit() -> None:
    """The largest accepted elongated image still resizes and crops like any other."""
    t = ImageTransform.from_config(CIFAR_PRE, MAX_PIXELS, (32, 32), max_resized_pixels=32 * 320)
    assert t(encode(Image.new("RGB", (320, 32), (255, 255, 255)), "PNG")).shape == (3, 32, 32)
    with pytest.raises(InputTooLarge):
        t(encode(Image.new("RGB", (321, 32), (255, 255, 255)), "PNG"))
