"""Plain JPEGs decoded by libjpeg-turbo directly (simplejpeg), skipping Pillow's Python layer.

Why: a served request is usually a small photo, and for a small JPEG Pillow's Python layer
(marker parsing, tile setup, `ImageFile.load`) costs several times the decode itself.
simplejpeg calls the same libjpeg-turbo routines (default DCT and fancy upsampling), so the pixels
are the ones Pillow gives, at full size and at the DCT scales of `Image.draft` alike; the tests
compare the two paths byte for byte.

Only JPEGs whose decode means nothing more than that take this path: YCbCr or greyscale, and no
EXIF block (Pillow's path applies its orientation). CMYK, Adobe RGB and anything the header reader
does not understand go to Pillow, which also words the errors for files that are not JPEGs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simplejpeg

from contract.errors import ErrorCode, InvalidInput

_SOI = b"\xff\xd8"
# The identifier of an EXIF APP1 segment. Searching the whole file may find it by chance in the
# entropy-coded data, which only sends that file down the general path.
_EXIF = b"Exif\x00\x00"
_PLAIN_COLORSPACES = ("YCbCr", "Gray")


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
        if colorspace not in _PLAIN_COLORSPACES:
            return None
        return cls(data, width, height)

    def decode(self, min_side: int | None = None) -> np.ndarray:
        """uint8 RGB [H, W, 3]; with `min_side`, at the DCT scale Pillow's `draft` picks."""
        factor = _draft_factor(self.width, self.height, min_side)
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


def _draft_factor(width: int, height: int, min_side: int | None) -> int:
    """Pillow's `draft` rule: the largest of 1/8, 1/4, 1/2 that keeps both sides >= `min_side`.

    (libjpeg-turbo also scales by other eighths, which simplejpeg would pick on its own; the
    powers of two keep the pixels the same as Pillow's.)"""
    if not min_side:
        return 1
    fits = min(width // min_side, height // min_side)
    return next((factor for factor in (8, 4, 2) if fits >= factor), 1)
