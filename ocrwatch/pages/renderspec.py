"""What a page may be and how it is rasterised: the types the renderers, the engines and the text
layer share, apart from the rendering itself (``render.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from PIL import Image

from ocrwatch.config import LimitsConfig
from ocrwatch.pages import orientation
from ocrwatch.pages.imagepages import DpiFrom
from ocrwatch.sources.base import Job

# A PDF page in this process while it is read: the PPM's bytes (3 a pixel) and Pillow's RGB image
# (4: Pillow stores RGB as 32 bits); PDFium's bitmap and its copy weigh the same.
PDF_BYTES_PER_PIXEL = 7

DEFAULT_DPI = 200
"""The DPI when neither ``[render] dpi`` nor an engine's geometry names one (a caller without an
engine): enough for print-size text, and an A4 page stays near 4 megapixels."""


@dataclass(frozen=True)
class Geometry:
    """The page size an engine reads best: its DPI, and the largest page it can use (None: no bound
    of its own). An engine declares it; ``render_spec`` turns it and ``[render]`` into a
    ``RenderSpec``."""

    dpi: int
    max_side: int | None = None
    max_pixels: int | None = None


@dataclass(frozen=True)
class Limits:
    """What a document may weigh before anything is rendered; an inbox (or its job) may override the
    global limits. Built here only, so the override rule is written once."""

    max_bytes: int
    max_pages: int

    @classmethod
    def from_config(cls, limits: LimitsConfig) -> Limits:
        """The global limits, with no inbox's override (what the benchmarks measure against)."""
        return cls(max_bytes=limits.max_bytes, max_pages=limits.max_pages)

    @classmethod
    def for_job(cls, limits: LimitsConfig, job: Job) -> Limits:
        """The job carries its inbox's overrides (a source copies them in), so the pipeline needs no
        inbox."""
        return cls._overridden(limits, job.max_bytes, job.max_pages)

    @classmethod
    def _overridden(
        cls, limits: LimitsConfig, max_bytes: int | None, max_pages: int | None
    ) -> Limits:
        return cls(
            max_bytes=max_bytes if max_bytes is not None else limits.max_bytes,
            max_pages=max_pages if max_pages is not None else limits.max_pages,
        )


@dataclass(frozen=True)
class RenderSpec:
    """How pages are rasterised.

    ``max_side``/``max_pixels`` bound the output (the config tightened by the engine's geometry).
    The refusal rule uses only the config's own caps (``limit_side``/``limit_pixels``): they protect
    memory, so a page is refused only when even ``min_dpi`` would exceed them. The engine's tighter
    caps are a geometry target, not a safety limit, so meeting them may take a PDF page below
    ``min_dpi`` (the model would have shrunk it anyway). ``child_memory``: the address space a
    pdftoppm child may map (``render.child_memory``; None: unbounded).
    """

    dpi: float
    max_side: int
    max_pixels: int
    min_dpi: float
    limit_side: int
    limit_pixels: int
    timeout_seconds: float
    renderer: Literal["pdftoppm", "pdfium"] = "pdftoppm"
    image_dpi: float | None = None  # an image's that records none (``imagepages.image_dpi``)
    upright: orientation.Settings = orientation.Settings()
    child_memory: int | None = None


@dataclass(frozen=True)
class DocumentInfo:
    """What ``probe`` learnt: the type by content, the page count, and each page's size.

    ``page_sizes`` are the units of the source: for a PDF, points of the CropBox with /Rotate
    applied (what pdftoppm renders); for an image, pixels as stored, before EXIF orientation.
    """

    kind: Literal["pdf", "image"]
    mime: str
    pages: int
    size_bytes: int
    page_sizes: tuple[tuple[float, float], ...]


@dataclass
class RenderedPage:
    """One page image; ``dpi`` is the resolution it was rendered at (an image's own, times the
    scale: ``imagepages.image_dpi``), also in the image's ``info["dpi"]`` for the engine, and
    ``dpi_from`` says where it came from; ``source_dpi``: an image file's resolutions across and
    down where they differ (its pixels were made square). The image is the page upright, as the
    engine reads it (``orientation``: what was done to it, ``width`` and ``height`` its size
    after)."""

    index: int
    image: Image.Image
    dpi: float
    width: int
    height: int
    seconds: float
    dpi_from: DpiFrom = "render"
    orientation: orientation.Orientation = orientation.AS_RENDERED
    source_dpi: tuple[float, float] | None = None
