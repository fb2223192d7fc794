"""A text layer's lines in the order a reader reads them: a heading across the page, then each
column top to bottom, the columns left to right (right to left on a page of right-to-left script),
a table row by row.

Poppler's own order (``pdftotext``'s) groups a page's blocks into flows and sorts those, which
puts a right column that starts a few points higher ahead of the left one. Its blocks and their
boxes (``pdftotext -bbox-layout``) are good; only their order is rebuilt here, XY-cut style: a
region's blocks are split at a gutter, an upright line with blocks side by side on either side of
it and the fewest blocks across it. Blocks across it (a title, a figure as wide as the page) cut
the region into bands, read in turn with those blocks between them; with none across it, the
region's left part is read before its right. A column or band without paragraphs side by side
is read top to bottom (blocks side by side in it, a figure's labels, in poppler's order); a whole
page without them keeps poppler's order.

A table is read row by row, as a reader reads it, not column by column as a gutter would split
it: its rows are lines that share a height, three short lines or more side by side (a cell's
words), where text columns put two long lines of sentences side by side at most, whether or not
their lines line up. Where such rows hold half a region's lines, an upright line through them is
no gutter; a region without another is read from its first such row to its last row by row,
each row's lines across the page, with its blocks above and below read before and after as
regions of their own (a title, a caption, text in columns under a table as wide as the page).

The text is then poppler's own, its lines moved (``arrange``): its spacing, and the hyphens it
took from words broken over lines, stay as poppler wrote them; a row's cells are set on one line.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_BLOCKS = 200
"""Blocks above which a page keeps poppler's order: a two-column page has some tens; a table of
many cells more, and its order would cost time (the gutter search grows with their cube)."""

MIN_LINES = 3
MIN_WIDTH = 72.0
"""Lines, and points of width, a block needs to stand for a column: a gutter is only one where
such paragraphs stand side by side across it. Labels in a figure, a table's cells, a contents
page's numbers beside its titles are blocks of a line or two, or narrow, side by side: no columns
(a table's rows are read across, the others keep poppler's order, which reads them by rows)."""

MIN_CELLS = 3
MAX_CELL_WORDS = 4
ROW_SHIFT = 0.3
"""A table's row: ``MIN_CELLS`` lines or more of ``MAX_CELL_WORDS`` words or fewer side by side,
their middles apart by ``ROW_SHIFT`` of the smaller line's height at most (a cell set in a
larger font still shares its row). Two text columns put at most two lines side by side, each of a
sentence's many words, however their lines line up."""

TOLERANCE = 0.5
"""Points by which boxes may touch and still be apart (poppler's boxes abut to a fraction)."""

_TAG = re.compile(r"<(block|line|word)\b([^>]*)>(?:([^<]*)</word>)?|</(block|line)>", re.ASCII)
_COORD = re.compile(r'(xMin|yMin|xMax|yMax)="(-?[0-9.]+)"', re.ASCII)


@dataclass(frozen=True)
class PopplerLine:
    """One of a block's lines: its box (points, from the page's top-left corner) and words."""

    x0: float
    y0: float
    x1: float
    y1: float
    words: tuple[str, ...]


@dataclass(frozen=True)
class PopplerBlock:
    """One of poppler's blocks: its box and its lines."""

    x0: float
    y0: float
    x1: float
    y1: float
    lines: tuple[PopplerLine, ...]


Line = tuple[int, int]
"""A line of the page: its block's index and its own within the block."""


def parse(layout: str) -> list[PopplerBlock]:
    """The blocks of one page of ``pdftotext -bbox-layout``'s XHTML, in poppler's order. Read by
    pattern, not as XML: a control character in a word would make a parser refuse the page."""
    blocks: list[PopplerBlock] = []
    box = line = (0.0, 0.0, 0.0, 0.0)
    lines: list[PopplerLine] = []
    words: list[str] = []
    for match in _TAG.finditer(layout):
        tag, closing = match.group(1), match.group(4)
        if tag == "block":
            box = _box(match.group(2))
            lines = []
        elif tag == "line":
            line = _box(match.group(2))
            words = []
        elif tag == "word":
            words.append(html.unescape(match.group(3) or ""))
        elif closing == "line":
            lines.append(PopplerLine(*line, tuple(words)))
        elif closing == "block":
            blocks.append(PopplerBlock(*box, tuple(lines)))
    return blocks


def _box(attributes: str) -> tuple[float, float, float, float]:
    found = dict(_COORD.findall(attributes))
    x0, y0, x1, y1 = (float(found.get(key, 0.0)) for key in ("xMin", "yMin", "xMax", "yMax"))
    return x0, y0, x1, y1


def order(blocks: list[PopplerBlock]) -> list[tuple[Line, ...]]:
    """The page's lines in reading order (module docstring), as the rows a reader reads: a table's
    cells side by side, one line each elsewhere."""
    if len(blocks) > MAX_BLOCKS:
        return [(line,) for line in _lines(blocks, range(len(blocks)))]
    return _order(blocks, list(range(len(blocks))), _right_to_left(blocks))


def _order(
    blocks: list[PopplerBlock], region: list[int], rtl: bool, part: bool = False
) -> list[tuple[Line, ...]]:
    """``region`` in reading order; ``part``: a column or band of a region split at a gutter,
    read top to bottom where it has no gutter of its own (a whole page without one keeps
    poppler's order)."""
    rows = _line_rows(blocks, region)
    cells = [
        row
        for row in rows
        if sum(len(_line(blocks, key).words) <= MAX_CELL_WORDS for key in row) >= MIN_CELLS
    ]
    table = _Table(cells, sum(len(row) for row in rows))
    gutter = _gutter(blocks, region, table)
    if gutter is None:
        if table.holds(table.rows):
            return _table_band(blocks, region, rtl, table.rows)
        return [(line,) for line in _lines(blocks, _rows(blocks, region) if part else region)]
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
        ordered += [(line,) for line in _lines(blocks, [cut])] + _order(blocks, band, rtl, True)
    return ordered


@dataclass(frozen=True)
class _Table:
    """A region's table rows (``MIN_CELLS``, ``MAX_CELL_WORDS``) and the count of all its lines."""

    rows: list[list[Line]]
    lines: int

    def holds(self, rows: list[list[Line]]) -> bool:
        """Whether ``rows`` (some of the table's) hold half the region's lines or more."""
        return 0 < self.lines <= 2 * sum(len(row) for row in rows)


def _table_band(
    blocks: list[PopplerBlock], region: list[int], rtl: bool, rows: list[list[Line]]
) -> list[tuple[Line, ...]]:
    """``region`` read as a table from its first row of cells (``rows``) to its last, row by row
    across the page; its other blocks above and below, in bands of their own, before and after."""
    top = min(_line(blocks, key).y0 for key in rows[0])
    bottom = max(_line(blocks, key).y1 for key in rows[-1])
    cells = {i for row in rows for i, _ in row}
    above = [i for i in region if i not in cells and blocks[i].y1 <= top + TOLERANCE]
    below = [i for i in region if i not in cells and blocks[i].y0 >= bottom - TOLERANCE]
    below = [i for i in below if i not in above]
    inside = [i for i in region if i not in above and i not in below]
    across = _across(blocks, rtl)
    table = [tuple(sorted(row, key=across)) for row in _line_rows(blocks, inside)]
    return _order(blocks, above, rtl, True) + table + _order(blocks, below, rtl, True)


def _lines(blocks: list[PopplerBlock], region: Iterable[int]) -> list[Line]:
    """The lines of ``region``'s blocks, block by block."""
    return [(i, number) for i in region for number in range(len(blocks[i].lines))]


def _line_rows(blocks: list[PopplerBlock], region: list[int]) -> list[list[Line]]:
    """``region``'s lines in rows, top to bottom: a row's middles apart by ``ROW_SHIFT`` of the
    smaller line's height at most."""
    rows: list[list[Line]] = []
    for key in sorted(_lines(blocks, region), key=lambda key: (_centre(_line(blocks, key)), key)):
        line = _line(blocks, key)
        first = _line(blocks, rows[-1][0]) if rows else None
        if first is not None and abs(_centre(line) - _centre(first)) <= ROW_SHIFT * min(
            line.y1 - line.y0, first.y1 - first.y0
        ):
            rows[-1].append(key)
        else:
            rows.append([key])
    return rows


def _across(blocks: list[PopplerBlock], rtl: bool) -> Callable[[Line], tuple[float, Line]]:
    """The key that sorts a row's lines as its script reads them."""
    if rtl:
        return lambda key: (-_line(blocks, key).x1, key)
    return lambda key: (_line(blocks, key).x0, key)


def _line(blocks: list[PopplerBlock], key: Line) -> PopplerLine:
    return blocks[key[0]].lines[key[1]]


def _centre(line: PopplerLine) -> float:
    return (line.y0 + line.y1) / 2


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


def _gutter(blocks: list[PopplerBlock], region: list[int], table: _Table) -> float | None:
    """The x of the region's best gutter (the right edge of a block left of it): paragraphs side by
    side across it, the fewest blocks over it, then the widest gap; None where no paragraphs
    stand side by side, or where the only such x cut through ``table``'s rows."""
    best: tuple[int, float] | None = None
    at = None
    for x in sorted({blocks[i].x1 for i in region}):
        left, right, over = _split(blocks, region, x)
        if not left or not right or not _side_by_side(blocks, left, right):
            continue
        if table.holds([row for row in table.rows if _cuts(blocks, row, x)]):
            continue
        gap = min(blocks[i].x0 for i in right) - x
        if best is None or (len(over), -gap) < best:
            best, at = (len(over), -gap), x
    return at


def _cuts(blocks: list[PopplerBlock], row: list[Line], x: float) -> bool:
    """Whether ``x`` has lines of ``row`` on both sides."""
    lines = [_line(blocks, key) for key in row]
    return any(line.x1 <= x + TOLERANCE for line in lines) and any(
        line.x0 >= x - TOLERANCE for line in lines
    )


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
            for word in line.words:
                for c in word:
                    kind = unicodedata.bidirectional(c)
                    if kind == "L":
                        counts[0] += 1
                    elif kind in ("R", "AL"):
                        counts[1] += 1
    return counts[1] > counts[0]


def arrange(text: str, blocks: list[PopplerBlock]) -> str | None:
    """Poppler's ``text`` of the page (``pdftotext``'s plain output) with its lines in reading
    order; None where its words cannot be matched to the blocks' (then poppler's order stands).
    A table row's cells are set on one line; lines no longer next to each other are set apart as
    paragraphs."""
    spans = _spans(text, blocks)
    if spans is None:
        return None
    numbers = {key: number for number, key in enumerate(_lines(blocks, range(len(blocks))))}
    rows = [[numbers[key] for key in row] for row in order(blocks)]
    sequence = [number for row in rows for number in row]
    if sequence == sorted(sequence):
        return text
    parts = [text[: spans[0][0]]]
    for place, row in enumerate(rows):
        for cell, index in enumerate(row):
            start, end, dropped = spans[index]
            parts += [text[start:end], "-" if dropped and cell + 1 < len(row) else ""]
            parts.append(" " if cell + 1 < len(row) else "")
        index = row[-1]
        following = rows[place + 1][0] if place + 1 < len(rows) else None
        if following == index + 1 and len(row) == 1:
            parts.append(text[spans[index][1] : spans[following][0]])
            continue
        parts.append("-" if spans[index][2] else "")
        if following is not None:
            parts.append("\n\n")
    parts.append(text[spans[-1][1] :])
    return "".join(parts)


def _spans(text: str, blocks: list[PopplerBlock]) -> list[tuple[int, int, bool]] | None:
    """Where each line's words lie in ``text`` (start, end, whether poppler dropped its last
    hyphen, joining it to the next line; a line of a lone hyphen so dropped is empty), the page's
    lines in poppler's order, or None where they do not match: the text's characters, spaces
    aside, are the words' in order, less the hyphen of a line poppler joined to the next."""
    spans: list[tuple[int, int, bool]] = []
    at, size = 0, len(text)
    for block in blocks:
        for line in block.lines:
            start, dropped = None, False
            for number, word in enumerate(line.words):
                last = number == len(line.words) - 1
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
            spans.append((at if start is None else start, at, dropped))
    return spans
