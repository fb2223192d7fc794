"""A page's text with its positions, as the ALTO and hOCR sidecars tell it (``results.alto``,
``results.hocr``): blocks of lines of words, each box in pixels of the page as it was rendered.

Boxes are given at the finest level the engine gives them, and nowhere finer: Tesseract's words
(its lines and paragraphs are the unions of their words' boxes); DeepSeek-OCR's grounding boxes for
its blocks, whose lines and words carry no box, since where a line lies within its block is not
known and none is made up. A page taken from its own text layer has no box at all.

The engines read the page turned upright (``pages[].rotation``, then ``deskew``); these files
describe the page as rendered, the image a viewer pairs them with, so each box is mapped back
through ``orientation.to_shown`` (a deskewed box becomes the upright rectangle around it) and the
page's ``rotation`` is the angle its text stands at there, counter-clockwise degrees. A confidence
is 0..1 (Tesseract's word confidence / 100); None where the engine gives none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ocrwatch.engines.base import is_figure
from ocrwatch.pages import orientation
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.results.textlayer import plain_lines

Box = tuple[int, int, int, int]
"""left, top, right, bottom in pixels of the page as rendered, its origin at the top-left."""

Place = Callable[[Any], "Box | None"]
"""A box of the upright page (the JSON's ``bbox``) on the page as rendered; None for none."""

MM_PER_INCH = 25.4

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class Word:
    text: str
    box: Box | None = None
    conf: float | None = None


@dataclass(frozen=True)
class Line:
    words: tuple[Word, ...]
    box: Box | None = None


@dataclass(frozen=True)
class Block:
    """A paragraph (Tesseract) or a grounding block (DeepSeek: ``kind`` is its label, ``title``,
    ``table``, ...); a figure (``image``) holds no lines."""

    kind: str
    lines: tuple[Line, ...]
    box: Box | None = None
    figure: bool = False


@dataclass(frozen=True)
class Page:
    """One page: ``number`` from 1, its size as rendered, ``dpi`` where its size in inches is known
    (a PDF page's, an image's recorded or configured resolution; not one assumed), ``rotation``
    counter-clockwise degrees, ``read``: whether the engine read it (a failed page has no text)."""

    number: int
    width: int
    height: int
    dpi: float | None
    rotation: float
    blocks: tuple[Block, ...]
    read: bool

    @property
    def conf(self) -> float | None:
        """The mean of its words' confidences, where they have one."""
        known = [
            w.conf for b in self.blocks for li in b.lines for w in li.words if w.conf is not None
        ]
        return round(sum(known) / len(known), 3) if known else None

    @property
    def millimetres(self) -> tuple[float, float] | None:
        """Its width and height in millimetres, where its DPI is known."""
        if not self.dpi:
            return None
        return (
            round(self.width / self.dpi * MM_PER_INCH, 1),
            round(self.height / self.dpi * MM_PER_INCH, 1),
        )


def pages(outcomes: Sequence[PageOutcome]) -> list[Page]:
    """The document's pages as ALTO and hOCR describe them."""
    return [page(outcome) for outcome in outcomes]


def page(outcome: PageOutcome) -> Page:
    turned = outcome.orientation
    width, height = outcome.width, outcome.height
    shown = (height, width) if turned.rotation in (90, 270) else (width, height)
    matrix = orientation.to_shown(turned, width, height)

    def place(values: Any) -> Box | None:
        return _placed(values, matrix, shown) if values else None

    recognition = outcome.result.recognition
    read = outcome.result.status == "ok" and recognition is not None
    blocks = _blocks(recognition.blocks, place) if read else []
    if read and not blocks and recognition.markdown.strip():
        # A page taken from its own text layer (or an engine that gives no blocks): text, no box.
        text = recognition.markdown
        lines = text.splitlines() if recognition.plain is not None else plain_lines(text)
        blocks = [Block("text", _lines(lines))]
    dpi = outcome.dpi if outcome.dpi and outcome.dpi_from != "assumed" else None
    rotation = round((turned.rotation + (turned.deskew or 0.0)) % 360, 2)
    return Page(outcome.index + 1, *shown, dpi, rotation, tuple(blocks), read)


def xml_text(text: str) -> str:
    """``text`` as XML 1.0 can hold it: a control character or a lone surrogate (a model's) becomes
    U+FFFD rather than a file no parser reads."""
    return _NOT_XML.sub("\ufffd", text)


def _blocks(found: Sequence[dict[str, Any]], place: Place) -> list[Block]:
    """Tesseract's line blocks grouped by paragraph; every other engine's blocks as they are."""
    blocks: list[Block] = []
    paragraph: object = None
    for block in found:
        words = block.get("words")
        if words:
            line = Line(
                tuple(Word(w["text"], place(w.get("bbox")), _conf(w.get("conf"))) for w in words),
                place(block.get("bbox")),
            )
            number = block.get("paragraph")
            if blocks and number is not None and number == paragraph:
                last = blocks[-1]
                blocks[-1] = Block(last.kind, (*last.lines, line), _union(last.box, line.box))
            else:
                blocks.append(Block("text", (line,), line.box))
            paragraph = number
            continue
        paragraph = None
        kind = str(block.get("type") or "text")
        if is_figure(block):
            if block.get("bbox"):
                blocks.append(Block(kind, (), place(block["bbox"]), figure=True))
            continue
        lines = _lines(plain_lines(str(block.get("text") or "")))
        if lines:
            blocks.append(Block(kind, lines, place(block.get("bbox"))))
    return blocks


def _lines(texts: Sequence[str]) -> tuple[Line, ...]:
    """Lines without boxes, each of its words."""
    split = (text.split() for text in texts)
    return tuple(Line(tuple(Word(word) for word in words)) for words in split if words)


def _conf(value: Any) -> float | None:
    """Tesseract's 0..100 as 0..1; its -1 (no confidence) as None."""
    if not isinstance(value, (int, float)) or value < 0:
        return None
    return round(min(float(value), 100.0) / 100, 3)


def _placed(values: Sequence[float], matrix: tuple[float, ...], shown: tuple[int, int]) -> Box:
    """An upright box on the page as rendered: the rectangle around its mapped corners, within the
    page."""
    a, b, c, d, e, f = matrix
    left, top, right, bottom = (float(value) for value in values)
    corners = [(left, top), (right, top), (left, bottom), (right, bottom)]
    xs = [a * u + c * v + e for u, v in corners]
    ys = [b * u + d * v + f for u, v in corners]
    width, height = shown
    return (
        min(max(math.floor(min(xs) + 1e-6), 0), width),
        min(max(math.floor(min(ys) + 1e-6), 0), height),
        min(max(math.ceil(max(xs) - 1e-6), 0), width),
        min(max(math.ceil(max(ys) - 1e-6), 0), height),
    )


def _union(first: Box | None, second: Box | None) -> Box | None:
    if first is None or second is None:
        return first or second
    return (
        min(first[0], second[0]),
        min(first[1], second[1]),
        max(first[2], second[2]),
        max(first[3], second[3]),
    )
