"""A text layer's blocks in the order a reader reads them: a heading across the page, then each
column top to bottom, the columns left to right (right to left on a page of right-to-left script).

Poppler's own order (``pdftotext``'s) groups a page's blocks into flows and sorts those, which
puts a right column that starts a few points higher ahead of the left one. Its blocks and their
boxes (``pdftotext -bbox-layout``) are good; only their order is rebuilt here, XY-cut style: a
region's blocks are split at a gutter, an upright line with blocks side by side on either side of
it and the fewest blocks across it. Blocks across it (a title, a figure as wide as the page) cut
the region into bands, read in turn with those blocks between them; with none across it, the
region's left part is read before its right. A column or band without paragraphs side by side
is read top to bottom (blocks side by side in it, a figure's labels, in poppler's order); a whole
page without them keeps poppler's order. The text is then poppler's own, its blocks moved
(``arrange``): its spacing, and the hyphens it took from words broken over lines, stay as poppler
wrote them.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass

MAX_BLOCKS = 200
"""Blocks above which a page keeps poppler's order: a two-column page has some tens; a table of
many cells more, and its order would cost time (the gutter search grows with their cube)."""

MIN_LINES = 3
MIN_WIDTH = 72.0
"""Lines, and points of width, a block needs to stand for a column: a gutter is only one where
such paragraphs stand side by side across it. Labels in a figure, a table's cells, a contents
page's numbers beside its titles are blocks of a line or two, or narrow, side by side; their order
stays poppler's, which reads them by rows."""

TOLERANCE = 0.5
"""Points by which boxes may touch and still be apart (poppler's boxes abut to a fraction)."""

_TAG = re.compile(r"<(block|line|word)\b([^>]*)>(?:([^<]*)</word>)?|</(block|line)>", re.ASCII)
_COORD = re.compile(r'(xMin|yMin|xMax|yMax)="(-?[0-9.]+)"', re.ASCII)


@dataclass(frozen=True)
class PopplerBlock:
    """One of poppler's blocks: its box (points, from the page's top-left corner) and its lines'
    words."""

    x0: float
    y0: float
    x1: float
    y1: float
    lines: tuple[tuple[str, ...], ...]


def parse(layout: str) -> list[PopplerBlock]:
    """The blocks of one page of ``pdftotext -bbox-layout``'s XHTML, in poppler's order. Read by
    pattern, not as XML: a control character in a word would make a parser refuse the page."""
    blocks: list[PopplerBlock] = []
    box = [0.0, 0.0, 0.0, 0.0]
    lines: list[tuple[str, ...]] = []
    words: list[str] = []
    for match in _TAG.finditer(layout):
        tag, closing = match.group(1), match.group(4)
        if tag == "block":
            found = dict(_COORD.findall(match.group(2)))
            box = [float(found.get(key, 0.0)) for key in ("xMin", "yMin", "xMax", "yMax")]
            lines = []
        elif tag == "line":
            words = []
        elif tag == "word":
            words.append(html.unescape(match.group(3) or ""))
        elif closing == "line":
            lines.append(tuple(words))
        elif closing == "block":
            x0, y0, x1, y1 = box
            blocks.append(PopplerBlock(x0, y0, x1, y1, tuple(lines)))
    return blocks


def order(blocks: list[PopplerBlock]) -> list[int]:
    """The indices of ``blocks`` in reading order (module docstring)."""
    if len(blocks) > MAX_BLOCKS:
        return list(range(len(blocks)))
    return _order(blocks, list(range(len(blocks))), _right_to_left(blocks))


def _order(
    blocks: list[PopplerBlock], region: list[int], rtl: bool, part: bool = False
) -> list[int]:
    """``region`` in reading order; ``part``: a column or band of a region split at a gutter,
    read top to bottom where it has no gutter of its own (a whole page without one keeps
    poppler's order)."""
    if len(region) < 2:
        return region
    gutter = _gutter(blocks, region)
    if gutter is None:
        return _rows(blocks, region) if part else region
    left, right, across = _split(blocks, region, gutter)
    if not across:
        first, second = (right, left) if rtl else (left, right)
        return _order(blocks, first, rtl, True) + _order(blocks, second, rtl, True)
    across.sort(key=lambda i: (_middle(blocks[i]), i))
    bands: list[list[int]] = [[] for _ in range(len(across) + 1)]
    for i in region:
        if i not in across:
            bands[sum(1 for j in across if _middle(blocks[j]) < _middle(blocks[i]))].append(i)
    ordered = _order(blocks, bands[0], rtl, True)
    for cut, band in zip(across, bands[1:], strict=True):
        ordered += [cut, *_order(blocks, band, rtl, True)]
    return ordered


def _rows(blocks: list[PopplerBlock], region: list[int]) -> list[int]:
    """``region`` top to bottom: blocks that share some height (labels of a figure, side by side)
    are a row, kept in poppler's order."""
    ordered: list[int] = []
    row: list[int] = []
    bottom = float("-inf")
    for i in sorted(region, key=lambda i: (blocks[i].y0, i)):
        if row and blocks[i].y0 >= bottom - TOLERANCE:
            ordered += sorted(row)
            row = []
        row.append(i)
        bottom = max(bottom, blocks[i].y1) if len(row) > 1 else blocks[i].y1
    return ordered + sorted(row)


def _gutter(blocks: list[PopplerBlock], region: list[int]) -> float | None:
    """The x of the region's best gutter (the right edge of a block left of it): paragraphs side by
    side across it, the fewest blocks over it, then the widest gap; None where no paragraphs
    stand side by side."""
    best: tuple[int, float] | None = None
    at = None
    for x in sorted({blocks[i].x1 for i in region}):
        left, right, over = _split(blocks, region, x)
        if not left or not right or not _side_by_side(blocks, left, right):
            continue
        gap = min(blocks[i].x0 for i in right) - x
        if best is None or (len(over), -gap) < best:
            best, at = (len(over), -gap), x
    return at


def _split(
    blocks: list[PopplerBlock], region: list[int], x: float
) -> tuple[list[int], list[int], list[int]]:
    """The region's blocks left of ``x``, right of it, and across it."""
    parts: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i in region:
        block = blocks[i]
        parts[0 if block.x1 <= x + TOLERANCE else 1 if block.x0 >= x - TOLERANCE else 2].append(i)
    return parts


def _side_by_side(blocks: list[PopplerBlock], left: list[int], right: list[int]) -> bool:
    """Whether a paragraph (``MIN_LINES``, ``MIN_WIDTH``) of ``left`` and one of ``right`` share
    some height."""
    spans = sorted(
        (blocks[i].y0, blocks[i].y1, side)
        for side, part in enumerate((left, right))
        for i in part
        if len(blocks[i].lines) >= MIN_LINES and blocks[i].x1 - blocks[i].x0 >= MIN_WIDTH
    )
    reach = [float("-inf"), float("-inf")]
    for y0, y1, side in spans:
        if reach[1 - side] > y0 + TOLERANCE:
            return True
        reach[side] = max(reach[side], y1)
    return False


def _middle(block: PopplerBlock) -> float:
    return (block.y0 + block.y1) / 2


def _right_to_left(blocks: list[PopplerBlock]) -> bool:
    """Whether most of the page's letters are of a right-to-left script (Arabic, Hebrew)."""
    counts = [0, 0]
    for block in blocks:
        for line in block.lines:
            for word in line:
                for c in word:
                    kind = unicodedata.bidirectional(c)
                    if kind == "L":
                        counts[0] += 1
                    elif kind in ("R", "AL"):
                        counts[1] += 1
    return counts[1] > counts[0]


def arrange(text: str, blocks: list[PopplerBlock]) -> str | None:
    """Poppler's ``text`` of the page (``pdftotext``'s plain output) with its blocks in reading
    order; None where its words cannot be matched to the blocks' (then poppler's order stands).
    Blocks no longer next to each other are set apart as paragraphs."""
    spans = _spans(text, blocks)
    if spans is None:
        return None
    sequence = order(blocks)
    if sequence == sorted(sequence):
        return text
    parts = [text[: spans[0][0]]]
    for number, index in enumerate(sequence):
        start, end, dropped = spans[index]
        following = sequence[number + 1] if number + 1 < len(sequence) else None
        parts.append(text[start:end])
        if following == index + 1:
            parts.append(text[end : spans[following][0]])
            continue
        parts.append("-" if dropped else "")
        if following is not None:
            parts.append("\n\n")
    parts.append(text[spans[-1][1] :])
    return "".join(parts)


def _spans(text: str, blocks: list[PopplerBlock]) -> list[tuple[int, int, bool]] | None:
    """Where each block's words lie in ``text`` (start, end, whether poppler dropped its last
    hyphen, joining its last line to the next block's first), or None where they do not match:
    the text's characters, spaces aside, are the words' in order, less the hyphen of a line
    poppler joined to the next."""
    spans: list[tuple[int, int, bool]] = []
    at, size = 0, len(text)
    for block in blocks:
        start, dropped = None, False
        for line in block.lines:
            for number, word in enumerate(line):
                last = number == len(line) - 1
                for place, char in enumerate(word):
                    while at < size and text[at].isspace():
                        at += 1
                    if at < size and text[at] == char:
                        start = at if start is None else start
                        at += 1
                        dropped = False
                    elif char == "-" and last and place == len(word) - 1:
                        dropped = True
                    else:
                        return None
        if start is None:
            return None
        spans.append((start, at, dropped))
    return spans
