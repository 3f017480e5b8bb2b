"""Image bytes -> the normalised CHW float32 array a served vision model expects.

The transform is the served model's own (`preprocessing` in config.json, docs/formats.md) and matches
the torchvision/timm eval transform it was trained with: resize the shorter side (torchvision's
size arithmetic), centre crop (torchvision's rounding), scale to [0, 1], normalise, CHW.

Decoding is defensive because the bytes come from strangers: only the formats we accept are tried,
the pixel count is checked from the header *before* decoding (decompression bombs), and so is the
size the image would have after the resize to the shorter side (an extreme aspect ratio, say a
65000x1 PNG of a few hundred bytes, would otherwise grow into tens of millions of pixels before the
crop: `resized_size`, `max_resized_pixels`), truncated files are errors rather than grey padding,
and exotic modes (16-bit, CMYK, palette, alpha) are brought to 8-bit RGB the way a viewer would show
them.

Plain JPEGs (`PlainJpeg`) are decoded by libjpeg-turbo directly (simplejpeg), skipping Pillow's
Python layer: a served request is usually a small photo, and for a small JPEG that layer (marker
parsing, tile setup, `ImageFile.load`) costs several times the decode itself. simplejpeg calls the
same libjpeg-turbo routines (default DCT and fancy upsampling), so the pixels are the ones Pillow
gives, at full size and at the DCT scales of `Image.draft` alike; the tests compare the two paths
byte for byte. Only JPEGs whose decode means nothing more than that take this path: YCbCr or
greyscale, and no EXIF block (Pillow's path applies its orientation). CMYK, Adobe RGB and anything
the header reader does not understand go to Pillow, which also words the errors for files that are
not JPEGs.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, ImageOps, UnidentifiedImageError

from contract.errors import ErrorCode, InputTooLarge, InvalidInput

# (Multi-picture camera JPEGs open through the JPEG plugin as format "MPO"; no entry needed.)
SUPPORTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
ACCEPTED_DESCRIPTION = "JPEG, PNG, WebP, GIF or BMP"

_RESAMPLING = {
    name: Image.Resampling[name.upper()]
    for name in ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
}
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_SOI = b"\xff\xd8"
# The identifier of an EXIF APP1 segment. Searching the whole file may find it by chance in the
# entropy-coded data, which only sends that file down the general path.
_EXIF = b"Exif\x00\x00"


def image_too_large(pixels: int, limit: int) -> InputTooLarge:
    return InputTooLarge(
        ErrorCode.IMAGE_TOO_LARGE,
        f"the image has {pixels} pixels; at most {limit} (width x height) are accepted",
    )


def check_pixels(width: int, height: int, limit: int) -> None:
    """Refuse an image whose header says it has more than `limit` pixels, before any decoding."""
    if width * height > limit:
        raise image_too_large(width * height, limit)


# Default of `max_resized_pixels`: 2048 x 2048 (12 MiB of RGB), an aspect ratio of up to 64:1 at the
# usual resize of 256 and far beyond any photo or panorama at smaller ones.
DEFAULT_MAX_RESIZED_PIXELS = 2048 * 2048


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Read only the header of `data`: its format (one we accept) and size (within `max_pixels`).

    Cheap whatever the image, so a caller can choose where to spend the decode (`load_image`)."""
    if not data:
        raise InvalidInput(ErrorCode.EMPTY_IMAGE, f"the image is empty; send a {ACCEPTED_DESCRIPTION} file")
    try:
        img = Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
    except Image.DecompressionBombError as exc:
        # Pillow's bomb message carries the pixel count; 0 if its wording changes.
        digits = [int(tok) for tok in str(exc).replace("(", " ").split() if tok.isdigit()]
        raise image_too_large(digits[0] if digits else 0, max_pixels) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidInput(
            ErrorCode.INVALID_IMAGE,
            f"the data is not a readable image; accepted formats are {ACCEPTED_DESCRIPTION}",
        ) from exc
    check_pixels(img.width, img.height, max_pixels)
    return img


def load_image(img: Image.Image, max_pixels: int, min_side: int | None = None) -> Image.Image:
    """Decode an image opened by `open_image` to a fully loaded, upright, 8-bit RGB image (first
    frame of animations).

    With `min_side`, a JPEG is decoded at the smallest of libjpeg's DCT scales (1/2, 1/4, 1/8)
    that keeps both sides >= `min_side` (Pillow's `draft`): a 12-megapixel photo headed for a
    224-pixel crop then costs a fraction of its full decode, and none of the pixels the resize
    would keep is lost as long as `min_side` is at least twice the resize target."""
    if min_side is not None and img.format in ("JPEG", "MPO"):
        img.draft(img.mode, (min_side, min_side))
    try:
        img.load()
    except Image.DecompressionBombError as exc:
        raise image_too_large(img.width * img.height, max_pixels) from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise InvalidInput(
            ErrorCode.INVALID_IMAGE, f"the {img.format} image is truncated or corrupt ({exc})"
        ) from exc
    # A malformed EXIF block must not lose the picture: keep it as stored.
    with contextlib.suppress(Exception):
        ImageOps.exif_transpose(img, in_place=True)  # no copy when there is nothing to turn
    return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB as a viewer shows it: 16-bit scaled (not clipped), transparency over white.

    Conversions that need intermediate images several times the size of the decoded one (deep
    greyscale, transparency) run in bands of rows (`_banded_rgb`), so that what an image costs
    stays close to its decoded size and the RGB result, whatever its mode."""
    try:
        if img.mode in _SIXTEEN_BIT_MODES or img.mode == "I":
            # "I" (32-bit) is what some decoders use for 16-bit data: such if it exceeds 8 bits.
            scaled = img.mode in _SIXTEEN_BIT_MODES or _largest(img) > 255
            return _banded_rgb(img, lambda band: Image.fromarray(_deep_to_8_bit(band, scaled)).convert("RGB"))
        if img.mode == "F":
            arr = np.asarray(img, dtype=np.float64)
            scale = 257.0 if arr.max(initial=0) > 255 else 1.0
            img = Image.fromarray(np.clip(np.rint(arr / scale), 0, 255).astype(np.uint8))
        if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
            return _banded_rgb(img, _over_white)
        return img if img.mode == "RGB" else img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise InvalidInput(
            ErrorCode.INVALID_IMAGE, f"image mode {img.mode} cannot be converted to RGB"
        ) from exc


# Pixels converted at a time by `_banded_rgb`: a few MiB of intermediate images.
BAND_PIXELS = 1 << 20


def _banded_rgb(img: Image.Image, convert: Callable[[Image.Image], Image.Image]) -> Image.Image:
    """`convert` (a per-pixel conversion to RGB) of `img`, a band of rows at a time (`crop` keeps
    the palette and the transparency information, so each band converts as the whole would)."""
    if img.width * img.height <= BAND_PIXELS:
        return convert(img)
    rows = max(1, BAND_PIXELS // img.width)
    out = Image.new("RGB", img.size)
    for top in range(0, img.height, rows):
        box = (0, top, img.width, min(img.height, top + rows))
        out.paste(convert(img.crop(box)), box[:2])
    return out


def _over_white(img: Image.Image) -> Image.Image:
    """Transparent pixels have undefined colour; show them over white, as a browser would."""
    rgba = img if img.mode == "RGBA" else img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    background.alpha_composite(rgba)
    return background.convert("RGB")


def _deep_to_8_bit(img: Image.Image, scaled: bool) -> np.ndarray:
    """16-bit (or 32-bit integer) greyscale -> uint8: scaled by 257 with rounding to nearest (or
    not: `scaled`), clipped to 0..255. Pillow's own convert clips I;16 to 255 (nearly white).

    In integers, in place: `(x + 128) // 257` is `rint(x / 257)` (no integer lies halfway), where
    floating point took several arrays of 8 bytes a pixel (a 70 KB PNG of 36 million grey pixels
    cost 800 MiB)."""
    dtype = np.uint32 if img.mode in _SIXTEEN_BIT_MODES else np.int64
    arr: np.ndarray[Any, np.dtype[np.integer[Any]]] = np.asarray(img).astype(dtype)
    if scaled:
        np.add(arr, 128, out=arr)
        np.floor_divide(arr, 257, out=arr)
    np.clip(arr, 0, 255, out=arr)
    return arr.astype(np.uint8)


def _largest(img: Image.Image) -> float:
    """The largest value of a single-band image, read by Pillow without copying its pixels."""
    extrema = img.getextrema()
    return float(extrema[1]) if isinstance(extrema, tuple) and not isinstance(extrema[0], tuple) else 0.0


@dataclass(frozen=True)
class PlainJpeg:
    """A JPEG that libjpeg-turbo decodes to exactly what Pillow would, with its header read."""

    data: bytes
    width: int
    height: int

    @classmethod
    def read(cls, data: bytes) -> PlainJpeg | None:
        """The header of `data` if it is a plain JPEG (see the module docstring); else None."""
        if not data.startswith(_SOI) or _EXIF in data:
            return None
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None
        return cls(data, width, height) if colorspace in ("YCbCr", "Gray") else None

    def decode(self, min_side: int | None = None) -> np.ndarray:
        """uint8 RGB [H, W, 3]; with `min_side`, at the DCT scale Pillow's `draft` picks: the
        largest of 1/8, 1/4, 1/2 that keeps both sides >= `min_side` (libjpeg-turbo also scales by
        other eighths, which simplejpeg would pick on its own; the powers of two keep the pixels
        the same as Pillow's)."""
        fits = min(self.width // min_side, self.height // min_side) if min_side else 0
        factor = next((factor for factor in (8, 4, 2) if fits >= factor), 1)
        try:
            return simplejpeg.decode_jpeg(
                self.data,
                colorspace="RGB",
                min_factor=factor,
                min_height=-(-self.height // factor),
                min_width=-(-self.width // factor),
            )
        except ValueError as exc:  # strict: a truncated or corrupt file is an error, not grey
            raise InvalidInput(
                ErrorCode.INVALID_IMAGE, f"the JPEG image is truncated or corrupt ({exc})"
            ) from exc


def _pair(value: Any) -> tuple[int, int]:
    """(height, width) from an int or a [height, width] list, as timm configs write sizes."""
    if isinstance(value, (list, tuple)):
        return int(value[-2]), int(value[-1])
    return int(value), int(value)


@dataclass(frozen=True)
class ImageTransform:
    """The eval transform of one served model, built from its `preprocessing` config."""

    crop_size: tuple[int, int]
    resize_size: int
    resample: Image.Resampling
    mean: np.ndarray
    std: np.ndarray
    max_pixels: int
    draft: bool = True  # JPEGs decoded at a reduced DCT scale (`decode_side`)
    max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS  # the image between resize and crop

    @classmethod
    def from_config(
        cls,
        preprocessing: dict[str, Any],
        max_pixels: int,
        input_hw: tuple[int, int] | None = None,
        draft: bool = True,
        max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS,
    ) -> ImageTransform:
        crop = _pair(preprocessing.get("crop_size") or input_hw)
        if input_hw is not None and crop != tuple(input_hw):
            raise ValueError(f"crop_size {crop} does not match the model input {input_hw}")
        resize = preprocessing.get("resize_size")
        if resize is None:
            resize = math.floor(min(crop) / float(preprocessing.get("crop_pct", 1.0)))
        if isinstance(resize, (list, tuple)):
            resize = min(_pair(resize))
        interpolation = str(preprocessing.get("interpolation", "bilinear"))
        if interpolation not in _RESAMPLING:
            raise ValueError(f"interpolation {interpolation!r} is not one of {sorted(_RESAMPLING)}")
        if int(resize) < max(crop):
            raise ValueError(f"resize_size {resize} is smaller than crop_size {crop}")
        # Shaped for channel planes [3, H, W] (`transform`).
        mean = np.asarray(preprocessing.get("mean", (0.5, 0.5, 0.5)), dtype=np.float32).reshape(3, 1, 1)
        std = np.asarray(preprocessing.get("std", (0.5, 0.5, 0.5)), dtype=np.float32).reshape(3, 1, 1)
        resample = _RESAMPLING[interpolation]
        return cls(crop, int(resize), resample, mean, std, max_pixels, draft, max_resized_pixels)

    @classmethod
    def for_model(
        cls,
        served_config: dict[str, Any],
        max_pixels: int,
        draft: bool = True,
        max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS,
    ) -> ImageTransform:
        """The transform a served vision model declares (its `preprocessing` and input shape)."""
        inputs = served_config.get("inputs") or []
        shape = inputs[0]["shape"] if inputs else None
        input_hw = (int(shape[-2]), int(shape[-1])) if shape else None
        preprocessing = dict(served_config.get("preprocessing") or {})
        return cls.from_config(preprocessing, max_pixels, input_hw, draft, max_resized_pixels)

    @property
    def decode_side(self) -> int | None:
        """The smallest side a JPEG is decoded at: twice the resize target (None: every pixel).

        At twice the target the answers stay those of a full decode on nearly every photo, at a
        fraction of the cost (docs/benchmarks.md, "Large JPEGs").
        `draft=False` (the service's `jpeg_draft` setting) decodes every pixel."""
        return 2 * self.resize_size if self.draft else None

    def __call__(self, data: bytes) -> np.ndarray:
        """Encoded image bytes -> float32 [3, H, W] (JPEGs decoded at a reduced DCT scale)."""
        return self.finish(self.open(data))

    def open(self, data: bytes) -> PlainJpeg | Image.Image:
        """The image's header only (format and size checked): `finish` does the decoding.

        A plain JPEG (`PlainJpeg`) is kept for libjpeg-turbo; anything else opens in Pillow."""
        header = PlainJpeg.read(data) or open_image(data, self.max_pixels)
        check_pixels(header.width, header.height, self.max_pixels)
        self.check_resized(header.width, header.height)
        return header

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after torchvision's Resize(int): the shorter side to `resize_size`, the
        longer one truncated proportionally. (A JPEG decoded at a DCT scale resizes to the same.)"""
        if width <= height:
            return self.resize_size, int(self.resize_size * height / width)
        return int(self.resize_size * width / height), self.resize_size

    def check_resized(self, width: int, height: int) -> None:
        """Refuse, from the header's size alone, an image whose resize before the crop would exceed
        `max_resized_pixels`: the resize to the shorter side multiplies an elongated image's
        pixels (a 65000x1 line would become 65000 times `resize_size` squared) however few it
        decodes to, and what is accepted is, in effect, an aspect ratio."""
        if width < 1 or height < 1:  # no decoder we accept opens one; the arithmetic below divides
            raise InvalidInput(ErrorCode.INVALID_IMAGE, f"the image is {width}x{height} pixels: it has none")
        new_w, new_h = self.resized_size(width, height)
        if new_w * new_h <= self.max_resized_pixels:
            return
        ratio = self.max_resized_pixels // (self.resize_size * self.resize_size)
        raise InputTooLarge(
            ErrorCode.IMAGE_TOO_LARGE,
            f"the image is {width}x{height} pixels: with its shorter side resized to {self.resize_size} it "
            f"would be {new_w}x{new_h} ({new_w * new_h} pixels) before the centre crop to "
            f"{self.crop_size[1]}x{self.crop_size[0]}; at most {self.max_resized_pixels} pixels are accepted "
            f"there, an aspect ratio of at most about {ratio}:1 for this model (max_resized_pixels)",
        )

    def finish(self, img: PlainJpeg | Image.Image) -> np.ndarray:
        """An image from `open` -> float32 [3, H, W]: decode, resize, crop, normalise."""
        if isinstance(img, PlainJpeg):
            return self.transform(img.decode(min_side=self.decode_side))
        return self.transform(load_image(img, self.max_pixels, min_side=self.decode_side))

    def transform(self, img: Image.Image | np.ndarray) -> np.ndarray:
        """RGB image (or uint8 [H, W, 3]) -> float32 [3, H, W]: resize shorter side, centre crop,
        scale to [0, 1], normalise. An image already at the model's input size is not resized."""
        height, width = img.shape[:2] if isinstance(img, np.ndarray) else (img.height, img.width)
        new_w, new_h = self.resized_size(width, height)
        if (new_w, new_h) != (width, height):
            pil = Image.fromarray(img) if isinstance(img, np.ndarray) else img
            img = pil.resize((new_w, new_h), self.resample)
        pixels = np.asarray(img)
        # Resize keeps both sides >= the crop (resize_size >= crop), so the crop is a plain slice.
        crop_h, crop_w = self.crop_size
        top = int(round((new_h - crop_h) / 2.0))
        left = int(round((new_w - crop_w) / 2.0))
        # Channels first while still uint8 (one small copy), then the arithmetic in place over whole
        # planes: the same operations in the same order as over [H, W, 3] pixels, so the same
        # floats, without numpy's inner loops over 3 channels (docs/benchmarks.md, "A real-size model").
        planes = np.ascontiguousarray(pixels[top : top + crop_h, left : left + crop_w].transpose(2, 0, 1))
        arr = planes.astype(np.float32)
        arr /= 255.0
        arr -= self.mean
        arr /= self.std
        return arr


def decode_base64(text: str, field: str) -> bytes:
    """An image sent base64-encoded in the JSON field `field`, plain or as a data: URL."""
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise InvalidInput(
                ErrorCode.INVALID_BASE64,
                "a data: URL image must be base64-encoded (data:image/...;base64,...)",
            )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            ErrorCode.INVALID_BASE64,
            "'image' is not valid base64; send the image file's bytes base64-encoded",
        ) from None
