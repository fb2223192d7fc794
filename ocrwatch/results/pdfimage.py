"""A page image as a PDF image object: the pixels kept as they are where PDF can hold them.

Kept apart from the text layer (``textlayer.py``), which places these images and the words above
them.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pikepdf
from pikepdf import Array, Name, Pdf
from PIL import Image

from ocrwatch.infra.memory import image_bytes
from ocrwatch.pages.render import BAND_BYTES


def decode_bytes(image: Image.Image, frames: int) -> int:
    """What the largest frame holds while it becomes a PDF image: its decoded pixels and one band
    converted from them (``flate_pixels``); nothing for a JPEG, whose own bytes are kept."""
    largest = 0
    for index in range(frames):
        image.seek(index)
        if not keeps_bytes(image):
            largest = max(largest, image_bytes(image.mode, image.width, image.height))
    return largest + 5 * BAND_BYTES if largest else 0


def orient(x: float, y: float, w: float, h: float, orientation: int) -> tuple[float, float]:
    """A stored pixel position (y down) to where EXIF ``orientation`` shows it."""
    return {
        1: (x, y),
        2: (w - x, y),
        3: (w - x, h - y),
        4: (x, h - y),
        5: (y, x),
        6: (h - y, x),
        7: (h - y, w - x),
        8: (y, w - x),
    }[orientation]


def image_xobject(pdf: Pdf, image: Image.Image, source: Path) -> pikepdf.Stream:
    """A JPEG's own bytes (not decoded and encoded again); other images' pixels, lossless."""
    palette = b""
    if keeps_bytes(image):
        data, filter_, mode = source.read_bytes(), Name.DCTDecode, image.mode
    else:
        (data, mode, palette), filter_ = flate_pixels(image), Name.FlateDecode
    space: Any = Name.DeviceRGB if mode == "RGB" else Name.DeviceGray
    if mode == "P":  # one byte a pixel and the palette, a third of the RGB pixels
        space = Array([Name.Indexed, Name.DeviceRGB, 255, pikepdf.String(palette)])
    return pdf.make_stream(
        data,
        Type=Name.XObject,
        Subtype=Name.Image,
        Width=image.width,
        Height=image.height,
        Filter=filter_,
        ColorSpace=space,
        BitsPerComponent=1 if mode == "1" else 8,
    )


def keeps_bytes(image: Image.Image) -> bool:
    return image.format == "JPEG" and image.mode in ("L", "RGB")


def flate_pixels(image: Image.Image) -> tuple[bytes, str, bytes]:
    """The frame's pixels as PDF takes them (``pdf_pixels``), compressed, with their mode and a
    palette's colours. Converted and compressed a band of rows at a time: besides the decoded frame
    only one band is held, where the whole frame converted held up to three more copies of it."""
    image.load()
    rows = max(1, BAND_BYTES // (image.width * 4))
    compressor = zlib.compressobj(6)
    parts, mode, palette = [], image.mode, b""
    for top in range(0, image.height, rows):
        band = pdf_pixels(image.crop((0, top, image.width, min(image.height, top + rows))))
        mode = band.mode
        if mode == "P":
            palette = bytes(band.getpalette("RGB") or []).ljust(768, b"\0")  # every index a colour
        parts.append(compressor.compress(band.tobytes()))
    parts.append(compressor.flush())
    return b"".join(parts), mode, palette


def pdf_pixels(image: Image.Image) -> Image.Image:
    """Bilevel, grey, palette or RGB, as PDF takes them; 16-bit grey scaled down, transparency
    flattened onto white."""
    if image.mode in ("1", "L", "RGB") or (image.mode == "P" and "transparency" not in image.info):
        return image
    if image.mode.startswith("I"):
        return image.convert("I").point(lambda value: value * (1 / 257)).convert("L")
    if image.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in image.info:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")
