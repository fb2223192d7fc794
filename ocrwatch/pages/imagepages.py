"""Image files as pages: the renderer's Pillow side, and the resolution of an image.

An image is probed from its header (a TIFF's frames are its pages; an animated PNG or WebP is one
picture, its first frame) and rendered whole: decoded within the shared ``DecodeBudget`` (refused
before decoding when it would exceed ``IMAGE_DECODE_FACTOR`` x the configured ``max_pixels``),
downscaled to the caps a band of rows at a time, its EXIF orientation applied, alpha flattened
onto white, grey kept grey.

**Resolution** (``image_dpi``): a page image needs one, for the searchable PDF's page size and
for Tesseract's sense of scale, and many images record none (a screenshot, a PNG written by a
scanner's software, a phone's export). The rule, in order: the DPI the file records; else
``[render] image_dpi``; else assumed from the image's size: its long side taken as an A4 page's
long side (297 mm: a scan of a page is the common case, and Letter's 11 in differs by 6 %), but
never below ``SCREEN_DPI`` (an image under 1,123 px on its long side is too small to be a page
scanned at a useful resolution: a screenshot or a picture, drawn at the screen's 96 px an inch).
The sidecar records the rendered page's DPI and which rule gave it (``dpi_from``). An image whose
resolutions across and down differ (a fine fax: 204 x 98 dpi) is read with square pixels, its
lower-resolution side scaled up (``square_pixels``): read as one DPI both ways its text would be
squashed and its page the wrong shape; the sidecar keeps both (``source_dpi``).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Literal

from PIL import ExifTags, Image, UnidentifiedImageError

from ocrwatch.errors import CorruptImage, TooManyPages, TooManyPixels
from ocrwatch.infra.memory import DecodeBudget, image_bytes

# An image is decoded whole before it is downscaled, so the decode itself must be bounded: up to
# this many times the configured max_pixels is accepted (a 1200-dpi A4 scan passes the default),
# anything larger is refused. Pillow's own decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS)
# applies on top and is never raised here.
IMAGE_DECODE_FACTOR = 4

BAND_BYTES = 8 * 1024 * 1024  # of the decoded image, brought to its page size band by band

A4_LONG_SIDE_INCHES = 297 / 25.4
"""The page an image without a recorded resolution is assumed to show, by its long side."""
SCREEN_DPI = 96.0
"""The least DPI assumed: a small image is a screen's picture (CSS's pixel, img2pdf's default)."""
SQUARE = 0.005
"""Relative difference below which an image's two resolutions are one: PNG records dots per
metre, so 200 dpi reads 199.9996."""

DpiFrom = Literal["render", "image", "image_dpi", "assumed"]
"""Where a page's DPI came from: the PDF renderer's own (``[render] dpi``, the engine's, lowered to
the caps), the image file's record, ``[render] image_dpi``, or the size rule (module docstring); an
image's DPI is scaled with the image when it is downscaled."""

_T = Image.Transpose  # EXIF orientation to the transposition that undoes it, as exif_transpose does
_ORIENTATION = {
    2: _T.FLIP_LEFT_RIGHT,
    3: _T.ROTATE_180,
    4: _T.FLIP_TOP_BOTTOM,
    5: _T.TRANSPOSE,
    6: _T.ROTATE_270,
    7: _T.TRANSVERSE,
    8: _T.ROTATE_90,
}

_PILLOW_FORMAT = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/tiff": "TIFF",
    "image/webp": "WEBP",
}


def image_dpi(
    recorded: object, size: tuple[int, int], configured: float | None
) -> tuple[tuple[float, float], DpiFrom]:
    """The resolution of an image of ``size`` pixels (as stored), across and down: what it records
    (Pillow's ``info["dpi"]``; a fax's differ, 204 x 98), else ``configured`` (``[render]
    image_dpi``), else the size rule. Resolutions within ``SQUARE`` of each other are one, the
    first."""
    across, down = (_resolution(recorded, at) for at in (0, 1))
    if across is not None:  # 0 or 1: a writer's placeholder, no resolution
        down = across if down is None or abs(down - across) <= SQUARE * across else down
        return (across, down), "image"
    if configured is not None:
        return (float(configured), float(configured)), "image_dpi"
    dpi = max(SCREEN_DPI, max(size) / A4_LONG_SIDE_INCHES)
    return (dpi, dpi), "assumed"


def _resolution(recorded: object, at: int) -> float | None:
    declared = 0.0
    if isinstance(recorded, tuple) and len(recorded) > at:
        # a TIFF's rational over zero
        with contextlib.suppress(TypeError, ValueError, ZeroDivisionError):
            declared = float(recorded[at])
    return declared if declared > 1 and math.isfinite(declared) else None


def square_pixels(size: tuple[int, int], dpi: tuple[float, float]) -> tuple[float, float]:
    """``size`` (pixels at ``dpi`` across and down) at the higher of the two both ways: a page whose
    pixels are not square is read with its lower-resolution side scaled up, so its text is not
    squashed."""
    top = max(dpi)
    return size[0] * top / dpi[0], size[1] * top / dpi[1]


def open_image(path: Path, mime: str) -> Image.Image:
    try:
        return Image.open(path, formats=[_PILLOW_FORMAT[mime]])
    except Image.DecompressionBombError as exc:
        raise TooManyPixels(f"{path}: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise CorruptImage(f"{path}: {exc}") from None


def probe_image(
    path: Path, mime: str, max_pages: int
) -> tuple[int, tuple[tuple[float, float], ...]]:
    """Frames are pages only for TIFF: an animated PNG or WebP is one picture, its first frame
    stands for it."""
    with open_image(path, mime) as image:
        try:
            frames = getattr(image, "n_frames", 1) if mime == "image/tiff" else 1
            if frames > max_pages:
                raise TooManyPages(f"{path}: {frames} frames, more than max_pages={max_pages}")
            sizes = []
            for frame in range(frames):
                image.seek(frame)
                sizes.append((float(image.width), float(image.height)))
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise CorruptImage(f"{path}: {exc}") from None
    return frames, tuple(sizes)


def render_image_page(
    path: Path,
    mime: str,
    index: int,
    *,
    max_side: int,
    max_pixels: int,
    limit_pixels: int,
    configured_dpi: float | None,
    budget: DecodeBudget,
) -> tuple[Image.Image, float, DpiFrom, tuple[float, float] | None]:
    """Frame ``index`` within the caps, its pixels made square (``square_pixels``), with its DPI
    (``image_dpi``'s higher, times the scale), where that came from, and the file's two
    resolutions where they differ; ``limit_pixels``: the configured cap the decode is bounded by."""
    with open_image(path, mime) as source:
        try:
            source.seek(index)
            stored = source.size
            resolution, dpi_from = image_dpi(source.info.get("dpi"), stored, configured_dpi)
            square = square_pixels(stored, resolution)
            # JPEG can decode at 1/2, 1/4 or 1/8 scale directly; other formats ignore the draft.
            scale = fit_scale(_pixels(square), max_side, max_pixels)
            if scale < 1:
                source.draft(None, (math.ceil(square[0] * scale), math.ceil(square[1] * scale)))
            width, height = source.size
            if width * height > IMAGE_DECODE_FACTOR * limit_pixels:
                raise TooManyPixels(
                    f"{path}: page {index + 1} would decode to {width} x {height} pixels, more "
                    f"than {IMAGE_DECODE_FACTOR} x max_pixels={limit_pixels}"
                )
            size = fit_size(_pixels(square_pixels(source.size, resolution)), max_side, max_pixels)
            with budget.hold(image_bytes(source.mode, width, height) + image_bytes("RGB", *size)):
                source.load()
                method = _ORIENTATION.get(source.getexif().get(ExifTags.Base.Orientation, 1))
                image = shrink(source, size)
                source.close()  # the full-size image goes before the heap is trimmed
        except Image.DecompressionBombError as exc:
            raise TooManyPixels(f"{path}: {exc}") from None
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise CorruptImage(f"{path}: page {index + 1}: {exc}") from None
    if method is not None:  # on the page-sized image: the caps are the same either way round
        image = image.transpose(method)
    dpi = round(max(resolution) * max(image.size) / max(square), 2)
    return image, dpi, dpi_from, None if resolution[0] == resolution[1] else resolution


def _pixels(size: tuple[float, float]) -> tuple[int, int]:
    return max(1, round(size[0])), max(1, round(size[1]))


def shrink(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image`` in its OCR mode at ``size``, made a band of rows at a time: besides the decoded
    image only the result and one band are held, where flattening and converting it whole would
    hold three more copies. Each band has the rows Lanczos reads beyond it (3 per output row), so
    the result is the whole-image resize."""
    width, height = image.size
    scale_y = height / size[1]
    margin = math.ceil(3 * scale_y) + 2 if size != image.size else 0
    rows = max(1, math.floor(BAND_BYTES / (width * 4 * scale_y)))
    result: Image.Image | None = None
    for y0 in range(0, size[1], rows):
        y1 = min(size[1], y0 + rows)
        top = max(0, math.floor(y0 * scale_y) - margin)
        bottom = min(height, math.ceil(y1 * scale_y) + margin)
        whole = (top, bottom) == (0, height)
        band = _ocr_mode(image if whole else image.crop((0, top, width, bottom)))
        if size != image.size:
            box = (0, y0 * scale_y - top, width, min(y1 * scale_y, bottom) - top)
            band = band.resize((size[0], y1 - y0), Image.Resampling.LANCZOS, box=box)
        if y1 - y0 == size[1]:
            return band
        if result is None:
            result = Image.new(band.mode, size)
        result.paste(band, (0, y0))
    assert result is not None
    return result


def _ocr_mode(image: Image.Image) -> Image.Image:
    """8-bit grey for single-channel sources, RGB otherwise, transparency flattened onto white.

    Grey stays grey: a bilevel or greyscale scan gains nothing from three equal channels but triple
    the memory, and as "L" rather than "1" it downscales with anti-aliased edges, which both
    Tesseract and the vision encoders read better than the jagged result of resampling 1-bit
    pixels. Engines must accept "L" and "RGB".
    """
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":  # 16-bit grey: scaled, convert("L") clips at 255
        return image.convert("I").point(lambda value: value * (1 / 257)).convert("L")
    grey = mode in ("1", "L", "LA", "La", "F") or (mode in ("P", "PA") and _palette_is_grey(image))
    transparent = mode == "P" and "transparency" in image.info
    has_alpha = mode in ("RGBA", "RGBa", "LA", "La", "PA") or transparent
    if has_alpha:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        flattened = Image.alpha_composite(white, image.convert("RGBA"))
        return flattened.convert("L" if grey else "RGB")
    return image.convert("L" if grey else "RGB")


def _palette_is_grey(image: Image.Image) -> bool:
    palette = image.getpalette() or []
    steps = range(0, len(palette) - 2, 3)
    return all(palette[i] == palette[i + 1] == palette[i + 2] for i in steps)


def fits(size: tuple[int, int], max_side: int, max_pixels: int) -> bool:
    return max(size) <= max_side and size[0] * size[1] <= max_pixels


def fit_scale(size: tuple[int, int], max_side: int, max_pixels: int) -> float:
    width, height = size
    return min(1.0, max_side / max(width, height), math.sqrt(max_pixels / (width * height)))


def fit_size(size: tuple[int, int], max_side: int, max_pixels: int) -> tuple[int, int]:
    scale = fit_scale(size, max_side, max_pixels)
    if scale >= 1:
        return size
    fitted = (max(1, math.floor(size[0] * scale)), max(1, math.floor(size[1] * scale)))
    while not fits(fitted, max_side, max_pixels):  # floor can leave a pixel too many on the product
        fitted = (max(1, fitted[0] - 1), max(1, fitted[1] - 1))
    return fitted
