"""Figures as files: each figure block's region cut out of the rendered page, as a PNG beside the
Markdown.

An engine names a figure block ``page-N-figure-K`` (``engines.base.is_figure``) and gives its box in
page pixels; the Markdown holds the placeholder ``![](page-N-figure-K)``. The region is cut right
after the page is recognised, while the scheduler still holds the page image, at the resolution it
was rendered at and upright (the image the engine read, turned by ``orientation``: a page scanned
sideways gives its figures upright, their boxes in that image's pixels), and kept as PNG bytes until
the document is written: the page image itself is let go as usual. Every PNG carries a ``Software:
ocrwatch`` text chunk ahead of its pixels, so a sink can tell a figure it wrote (left by a write
that never reached its JSON) from a user's file by its first bytes. An engine that names no figure
block gives no figures.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import structlog
from PIL import Image, PngImagePlugin

from ocrwatch.engines.base import PageRequest, is_figure
from ocrwatch.errors import classify

log = structlog.get_logger()

MARK = b"tEXtSoftware\x00ocrwatch"
"""The text chunk every figure PNG opens with, right after its header."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Figure:
    """One figure's pixels as PNG, and where on its page (1-based) they were cut from."""

    name: str
    page: int
    bbox: tuple[int, int, int, int]
    png: bytes

    @property
    def file(self) -> str:
        return f"{self.name}.png"


def crop(image: Image.Image, blocks: Sequence[dict[str, Any]], page: int) -> tuple[Figure, ...]:
    """The figure blocks' regions of ``image`` (a block without a box, or whose box holds no pixel,
    gives none: its placeholder stays). Blocking: PNG encoding takes a few ms per figure."""
    figures = []
    for block in blocks:
        if not is_figure(block) or not block.get("bbox"):
            continue
        left, top, right, bottom = (int(value) for value in block["bbox"])
        left, top = max(left, 0), max(top, 0)
        right, bottom = min(right, image.width), min(bottom, image.height)
        if right <= left or bottom <= top:
            continue
        info = PngImagePlugin.PngInfo()
        info.add_text("Software", "ocrwatch")
        out = io.BytesIO()
        image.crop((left, top, right, bottom)).save(out, "PNG", pnginfo=info)
        figures.append(Figure(str(block["name"]), page, (left, top, right, bottom), out.getvalue()))
    return tuple(figures)


async def extract(request: PageRequest, result: Any) -> tuple[Figure, ...]:
    """The scheduler's ``extract`` for ``[output] images = "extract"``: the figures of a page read
    well, cut in a worker thread. Never raises: a figure that cannot be cut keeps its placeholder,
    and the page its text."""
    recognition = getattr(result, "recognition", None)
    if getattr(result, "status", None) != "ok" or recognition is None:
        return ()
    blocks = [block for block in recognition.blocks if is_figure(block) and block.get("bbox")]
    if not blocks or request.image is None:
        return ()
    try:
        return await asyncio.to_thread(crop, request.image, blocks, request.page_index + 1)
    except Exception as exc:
        log.warning(
            "figures_not_extracted",
            page=request.page_index + 1,
            kind=classify(exc).kind,
            error=str(exc),
        )
        return ()


def extractor(images: str) -> Callable[[PageRequest, Any], Awaitable[tuple[Figure, ...]]] | None:
    """The scheduler's ``extract`` for ``[output] images``: ``extract`` only with ``images =
    "extract"``."""
    return extract if images == "extract" else None


def link(markdown: str, figures: Sequence[Figure], assets: str) -> str:
    """The page's Markdown with each extracted figure's placeholder pointing at its file under
    ``assets`` (a relative link, percent-encoded, so a name with spaces or brackets stays one
    link)."""
    for figure in figures:
        markdown = markdown.replace(
            f"![]({figure.name})", f"![]({quote(assets)}/{quote(figure.file)})"
        )
    return markdown


def is_ours(head: bytes) -> bool:
    """Whether a file beginning with ``head`` is a figure ocrwatch wrote."""
    return head.startswith(PNG_SIGNATURE) and MARK in head
