"""The images a PDF's pages list, measured from their dictionaries before any page is rendered.

pdftoppm decodes an image whole before it scales it onto the page, whatever the page's resolution
(a JPEG 2000 image at four bytes a sample), so a PDF of a few hundred bytes whose image declares
24,000 x 24,000 pixels takes 2.3 GB to render one page. ``oversized`` finds such an image without
decoding anything: each page's image XObjects, those its resources list and those of the forms,
patterns, Type 3 fonts and annotation appearances reachable from them (drawn or not), each object
once and ``MAX_OBJECTS`` at most per document. A JPEG 2000 image is measured by its codestream's
header too (``SIZ``), which is what the decoder believes, whatever the dictionary says. What this
cannot see (an inline image, a file qpdf cannot open) is left to the render child's memory limit
(``render.child_memory``).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path

import pikepdf
from pikepdf import Array, Dictionary, Name, Stream

MAX_OBJECTS = 200_000
"""Objects looked at per document, at most: a few per image and form of an ordinary page, so only
a document built to be walked runs out (then it is left to the child's memory limit)."""

MAX_PARENTS = 64
"""Levels of the page tree climbed for inherited resources."""

_SIZ = b"\xff\x4f\xff\x51"  # a codestream's start (SOC) and its image and tile size (SIZ)
_SIZ_FIELDS = struct.Struct(">HHIIII")  # Lsiz, Rsiz, Xsiz, Ysiz, XOsiz, YOsiz


@dataclass(frozen=True)
class PdfImage:
    """An image a page lists: the page's number (from 1) and the pixels a decoder makes of it."""

    page: int
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def oversized(path: Path, pages: int, max_pixels: int) -> PdfImage | None:
    """The first image of the first ``pages`` pages that decodes to more than ``max_pixels``
    pixels; None when there is none, or when the file cannot be walked here (qpdf refuses some files
    poppler reads, and some walks are too long): the render child's limit stands behind those.
    Blocking."""
    try:
        with pikepdf.open(path) as pdf:
            seen: set[tuple[int, int]] = set()
            left = MAX_OBJECTS
            for number, page in enumerate(itertools.islice(pdf.pages, pages), 1):
                todo = [_inherited(page.obj, Name.Resources), page.obj.get(Name.Annots)]
                while todo:
                    left -= 1
                    if left < 0:
                        return None
                    found = _visit(todo.pop(), number, seen, todo)
                    if found is not None and found.pixels > max_pixels:
                        return found
    except (pikepdf.PdfError, pikepdf.PasswordError, OSError):
        return None
    return None


def _inherited(page: Dictionary, key: Name) -> object:
    """The page's entry ``key``, or the nearest ancestor's in the page tree (resources are
    inheritable)."""
    node: object = page
    for _ in range(MAX_PARENTS):
        if not isinstance(node, Dictionary):
            return None
        if key in node:
            return node[key]
        node = node.get(Name.Parent)
    return None


def _visit(
    obj: object, page: int, seen: set[tuple[int, int]], todo: list[object]
) -> PdfImage | None:
    """Look at one object: an image is measured, anything else has what it holds put in ``todo``
    (never a page or the page tree: they are walked as pages, by their own number)."""
    if not isinstance(obj, (Dictionary, Array, Stream)):
        return None
    if obj.is_indirect:
        if obj.objgen in seen:
            return None
        seen.add(obj.objgen)
    if isinstance(obj, Array):
        todo.extend(obj)
        return None
    if obj.get(Name.Type) in (Name.Page, Name.Pages):
        return None
    if isinstance(obj, Stream) and obj.get(Name.Subtype) == Name.Image:
        todo.extend(obj.get(key) for key in (Name.SMask, Name.Mask))
        return _measured(obj, page)
    todo.extend(value for key, value in obj.items() if key != "/Parent")
    return None


def _measured(image: Stream, page: int) -> PdfImage:
    """The image's pixels by its dictionary, or by its JPEG 2000 codestream where that says more."""
    width, height = _whole(image.get(Name.Width)), _whole(image.get(Name.Height))
    filters = image.get(Name.Filter)
    if filters == Name.JPXDecode or (
        isinstance(filters, Array) and len(filters) == 1 and filters[0] == Name.JPXDecode
    ):
        data = image.read_raw_bytes()
        at = data.find(_SIZ)
        if at >= 0 and at + len(_SIZ) + _SIZ_FIELDS.size <= len(data):
            _, _, right, bottom, left, top = _SIZ_FIELDS.unpack_from(data, at + len(_SIZ))
            declared = max(right - left, 0), max(bottom - top, 0)
            if declared[0] * declared[1] > width * height:
                width, height = declared
    return PdfImage(page, width, height)


def _whole(value: object) -> int:
    """A dictionary's number as a count of pixels; 0 for anything else (poppler refuses it)."""
    try:
        return max(int(value), 0)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0
