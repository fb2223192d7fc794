"""Pages turned upright before they are read: Tesseract's orientation detection, and deskew.

Every rendered page, for either engine, goes through ``upright`` in its render worker (blocking, off
the event loop). With ``[render] rotate_pages``, a page is decided by the cheapest test that can:

1. Its text lines (``survey``, a few hundredths of a second), found on a bilevel copy at
   ``LINES_DPI`` (by the DPI the file claims; finer where that shows too few lines, or lines too
   small, as on a 150-dpi scan that says 600: ``_surveyed``), where turned some way they look like
   upright Latin lines: ``text_lines`` (a turn only where they lie in rows and columns of tiles:
   large letters' strokes look like lines).
2. OSD's glance: Tesseract's orientation detection (``--psm 0``) on the window of the page densest
   in text lines, scaled so its lines are ``GLANCE_LINE`` pixels high (the text's own height, not
   the DPI the file claims), from ``GLANCE_CHARACTERS`` characters: a third of OSD's cost on the
   whole page. Upright is taken (``osd``); a turn below the threshold is read (below) and taken
   where it reads ``GLANCE_READ_CHARACTERS`` (``reading``).
3. OSD on the whole page: what the glance left undecided.

OSD's runs and its report are ``osd``'s; the script it names is kept (``Orientation.script``) for
``lang = "auto"``.

OSD's confidence is the margin between its best orientation and the next; on a page with little
text it is small and often wrong, so its answer is taken in three bands:

- at ``rotate_pages_threshold`` or above (14 by default, OCRmyPDF's): as it is;
- from ``READ_FLOOR`` up to the threshold: checked by reading (Tesseract, ``READ_LANG``) the
  glance's window, its rules made white (``unruled``: Tesseract reads nothing inside a table's
  frame), unturned, turned as OSD says and turned the opposite way (OSD unsure of a page on
  its side often has it upside down), and turned only where the best of them reads at least
  ``READ_RATIO`` times as many characters of confident words (``READ_CONFIDENCE``) as unturned;
  where no way round reads ``READ_MIN_CHARACTERS``, the page says so (``reads_poorly``, in its
  JSON and a ``page_reads_poorly`` warning);
- below ``READ_FLOOR``, or no answer at all (too few characters): kept as it is.

With ``[render] deskew`` the upright page is then levelled by the small angle ``deskew`` finds.
The engine reads the upright image; ``to_shown`` maps its pixels back to the page as rendered (as a
viewer shows it), which the searchable PDF's text layer is placed through.
"""

from __future__ import annotations

import array
import dataclasses
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

import structlog
from PIL import Image

from ocrwatch.errors import ConfigError
from ocrwatch.pages import deskew
from ocrwatch.pages.osd import (
    BINARY,
    LATIN,
    READ_LANG,
    Answer,
    detect,
    readable_characters,
    unruled,
)

log = structlog.get_logger()

OSD_MAX_DPI = 300
"""A page rendered finer is shrunk to this for detection: OSD is trained on 300 dpi text."""
READ_FLOOR = 1.0
"""OSD's confidence below which a turned answer is not even checked (upright pages of little text
are read turned at 0.2 to 0.5 confidence: a map, a chart, a title page)."""
READ_RATIO = 2.0
READ_MIN_CHARACTERS = 10
"""A turned page must read at least this many characters of confident words to be turned."""

LINES_DPI = 150.0
"""The resolution the text-line test reads a page at: a line of 10-point text is ~20 pixels high,
enough to tell the x-height band from the ascenders above it and the descenders below it."""
LINES_TILE = 160
"""The side of the square tiles, in ``LINES_DPI`` pixels (about an inch), each judged on its own:
a tile holds a few lines of one column, whatever the page's layout."""
LINES_INK = (0.02, 0.35)
"""The share of a tile's pixels that must be ink for it to be judged: less is margin or a stray
mark, more a picture or a dark background."""
LINE_HEIGHT = (8, 60)
"""The height, in ``LINES_DPI`` pixels, of a band of inked rows taken for a line of text."""
LINES_MIN = 10
"""The fewest lines across the page for the test to speak: fewer (a title page, a form, a map)
go to OSD."""
LINES_SPREAD = 2
"""The fewest rows, and columns, of tiles a turn's text lines must come from (``_says_upright``)."""
LINES_FINE = 12
"""The median height, in ``LINES_DPI`` pixels, below which a page's lines are too few pixels for
the test to judge them (a 6-point line): a page that claims a higher DPI is looked at finer."""
LINES_MAX_PIXELS = 2_250_000
"""The most pixels the text-line test looks at a page again in (``_surveyed``): about a Letter or
A4 page at ``LINES_DPI``, what surveying a page whose DPI is right costs."""
LINES_ACROSS = 2.0
"""How many times as many lines must run across the page as along it (a page on its side)."""
LINES_ASCENDERS = 1.6
"""How many times as much ink must lie above the lines' x-height band as below it: Latin text
upright has more ascenders and capitals than descenders (about 3:1 in English prose, 1.7:1 in the
corpus's least), upside down it has the reverse (at most 0.8:1 in the corpus)."""
LINES_CORE = (0.4, 0.7)
"""The share of a line's height its dense middle (the rows with at least half its busiest row's
ink) must take: Latin's x-height band. Devanagari's headline (~0.13), Arabic's baseline (~0.1) and
CJK's square glyphs (~0.76) fall outside, and so do a sideways page's columns cut across (~0.8),
so pages of those scripts go to OSD, which knows them."""

GLANCE_CHARACTERS = 10
"""How many characters the glance's OSD classifies at least (Tesseract's default is 50, then up to
five times as many): each costs about a hundredth of a second of one core."""
GLANCE_LINE = 30.0
"""The height, in pixels, that the glance scales the page's median text line to: its lowercase
letters then stay above the 10 pixels below which OSD leaves a character out."""
GLANCE_SIDE = 1000
"""The side, in pixels once scaled, of the window of the page the glance reads: some thirty lines
of text, where Tesseract's layout analysis of a whole page at 300 dpi costs more than its
classification."""
GLANCE_READ_CHARACTERS = 30
"""A turn the glance finds is taken without asking OSD about the whole page only where the
glance's window, turned so, reads at least this many confident characters (and ``READ_RATIO``
times as many as unturned): a window of a few words can read better turned by chance."""

DecidedBy = Literal["text_lines", "osd", "reading", "low_confidence", "too_little_text", "failed"]
"""How a page's rotation was decided: kept as it is because its text lines say it is upright,
OSD's answer as it is, the reading check, or kept as it is because OSD was unsure, found too few
characters, or could not run (the log says why)."""

_T = Image.Transpose
_TURN = {90: _T.ROTATE_270, 180: _T.ROTATE_180, 270: _T.ROTATE_90}  # clockwise to Pillow's turns


@dataclass(frozen=True)
class Orientation:
    """What was done to a page to read it: ``rotation`` clockwise degrees (a right angle), then
    ``deskew`` clockwise degrees about its centre (None: deskew is off). ``detected`` is OSD's
    answer (clockwise degrees that make it upright) and ``confidence`` its margin; both None where
    OSD did not run or gave no answer. ``read``: the most confident characters any way round read
    where the reading check ran (``reads_poorly``), else None. ``script``: the script OSD found
    (``Latin``, ``Cyrillic``, ...; Latin where the text lines decided, as only Latin lines pass
    them), None where OSD did not run or named none."""

    rotation: int = 0
    detected: int | None = None
    confidence: float | None = None
    decided_by: DecidedBy | None = None
    deskew: float | None = None
    seconds: float = 0.0
    read: int | None = None
    script: str | None = None

    @property
    def turned(self) -> bool:
        return self.rotation != 0 or bool(self.deskew)

    @property
    def reads_poorly(self) -> bool:
        """Whether the reading check found no way round in which the page reads
        ``READ_MIN_CHARACTERS`` confident characters: turned or not, its text may be lost."""
        return self.read is not None and self.read < READ_MIN_CHARACTERS


AS_RENDERED = Orientation()
"""A page read as it was rendered, neither detection nor deskew asked for."""


@dataclass(frozen=True)
class Settings:
    """``[render] rotate_pages``, ``rotate_pages_threshold`` and ``deskew``; ``timeout``: each
    Tesseract run's deadline (``[render] timeout_seconds``)."""

    rotate: bool = False
    threshold: float = 14.0
    deskew: bool = False
    timeout: float = 120.0


def check(rotate: bool) -> None:
    """Fail at start, not on every page, when detection is asked for and Tesseract or its ``osd``
    (and ``READ_LANG``) data is missing."""
    if not rotate:
        return
    hint = "install tesseract-ocr and tesseract-ocr-osd, or set [render] rotate_pages = false"
    if shutil.which(BINARY) is None:
        raise ConfigError(f"[render] rotate_pages needs {BINARY!r} on PATH", hint=hint)
    try:
        done = subprocess.run(
            [BINARY, "--list-langs"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        message = f"[render] rotate_pages: {BINARY} --list-langs failed: {exc}"
        raise ConfigError(message, hint=hint) from None
    missing = {"osd", READ_LANG} - set(done.stdout.split())
    if done.returncode != 0 or missing:
        what = " or ".join(sorted(missing)) or "language"
        raise ConfigError(f"[render] rotate_pages: tesseract has no {what} data", hint=hint)


def upright(image: Image.Image, dpi: float, settings: Settings) -> tuple[Image.Image, Orientation]:
    """The page turned upright (and levelled, with ``settings.deskew``), and what was done to it.
    Blocking: it runs Tesseract. Never raises for the page's sake: a detection that fails keeps the
    page as it is and says so (``decided_by = "failed"``, and a warning in the log)."""
    if not settings.rotate and not settings.deskew:
        return image, AS_RENDERED
    started = time.perf_counter()
    decided = AS_RENDERED
    if settings.rotate:
        decided = _decide(image, dpi, settings)
        image = turn(image, decided.rotation)
        if decided.reads_poorly:
            log.warning("page_reads_poorly", read=decided.read, rotation=decided.rotation)
    skew = None
    if settings.deskew:
        skew = deskew.skew_angle(image)
        if skew:
            image = deskew.straighten(image, skew)
    seconds = time.perf_counter() - started
    return image, dataclasses.replace(decided, deskew=skew, seconds=seconds)


def turn(image: Image.Image, clockwise: int) -> Image.Image:
    """``image`` turned ``clockwise`` degrees (0, 90, 180 or 270): lossless, a new image."""
    return image.transpose(_TURN[clockwise]) if clockwise else image


def to_shown(orientation: Orientation, width: int, height: int) -> tuple[float, ...]:
    """The affine map ``(a, b, c, d, e, f)`` from a pixel of the upright page (``width`` x
    ``height``, y down) to the page as rendered (y down): ``x = a*u + c*v + e``,
    ``y = b*u + d*v + f``, PDF's matrix order. Undoes the deskew (about the centre), then the
    right-angle turn."""
    angle = math.radians(orientation.deskew or 0.0)
    cos, sin = math.cos(angle), math.sin(angle)
    cx, cy = width / 2, height / 2
    # Deskew undone: the upright page turned back counter-clockwise about its centre (y down).
    a, b, c, d = cos, -sin, sin, cos
    e, f = cx - cos * cx - sin * cy, cy + sin * cx - cos * cy
    # The turn undone: a clockwise turn by r maps the rendered (W x H) pixel (x, y) to (H - y, x) at
    # 90, (W - x, H - y) at 180, (y, W - x) at 270; each inverted here, W x H the rendered size.
    shown_w, shown_h = (height, width) if orientation.rotation in (90, 270) else (width, height)
    back = {
        0: (1.0, 0.0, 0.0, 1.0, 0.0, 0.0),
        90: (0.0, -1.0, 1.0, 0.0, 0.0, float(shown_h)),
        180: (-1.0, 0.0, 0.0, -1.0, float(shown_w), float(shown_h)),
        270: (0.0, 1.0, -1.0, 0.0, float(shown_w), 0.0),
    }[orientation.rotation]
    return _then((a, b, c, d, e, f), back)


def _then(first: tuple[float, ...], second: tuple[float, ...]) -> tuple[float, ...]:
    """The affine map ``first`` followed by ``second`` (both in ``to_shown``'s order)."""
    a1, b1, c1, d1, e1, f1 = first
    a2, b2, c2, d2, e2, f2 = second
    return (
        a1 * a2 + b1 * c2,
        a1 * b2 + b1 * d2,
        c1 * a2 + d1 * c2,
        c1 * b2 + d1 * d2,
        e1 * a2 + f1 * c2 + e2,
        e1 * b2 + f1 * d2 + f2,
    )


def _decide(image: Image.Image, dpi: float, settings: Settings) -> Orientation:
    """The rotation to apply and how it was decided (module docstring): the text lines first,
    then OSD's glance at the page's densest text, then OSD on the whole page where the glance is
    unsure and reading does not settle it."""
    page, page_dpi, tiles = _surveyed(image, dpi)
    lines_turn = turn_from_lines(tiles)
    if lines_turn is not None:
        return Orientation(lines_turn, decided_by="text_lines", script=LATIN)
    box, scale = window(page.size, page_dpi, tiles)
    sample = _scaled(page.crop(box) if box else page, scale)
    with tempfile.TemporaryDirectory(prefix="ocrwatch-osd-") as folder:
        reading = _Reading(sample, page_dpi * scale, folder, settings.timeout)
        glanced = None
        try:
            glanced = glance(sample, page_dpi * scale, folder, settings.timeout)
            if glanced is None and box is None:  # the whole page as it is: OSD would say the same
                return Orientation(decided_by="too_little_text")
            if glanced is not None:
                clockwise, confidence, script = glanced[:3]
                if clockwise == 0 or confidence >= settings.threshold:
                    return Orientation(clockwise, clockwise, confidence, "osd", script=script)
                best, read = reading.best(clockwise) if box else (0, 0)
                if best and read >= GLANCE_READ_CHARACTERS:
                    return Orientation(
                        best, clockwise, confidence, "reading", read=read, script=script
                    )
        except OSError as exc:  # a crashed or killed Tesseract, a full temporary folder
            log.warning("orientation_failed", error=str(exc))
            if glanced is None:
                return Orientation(decided_by="failed")
            return Orientation(
                0, glanced.rotate, glanced.confidence, "failed", script=glanced.script
            )
        return _whole_page(page, page_dpi, folder, settings, reading)


def _whole_page(
    page: Image.Image, page_dpi: float, folder: str, settings: Settings, reading: _Reading
) -> Orientation:
    """OSD on the whole page (``OSD_MAX_DPI`` at most) and its answer taken in the three bands of
    the module docstring. The reading check reads ``reading``'s image (the glance's window, its
    lines scaled to ``GLANCE_LINE``; what it read already is not read again)."""
    path = os.path.join(folder, "page.pgm")
    page.save(path)
    try:
        answer = detect(path, page_dpi, settings.timeout)
    except OSError as exc:  # a crashed or killed Tesseract, a full temporary folder
        log.warning("orientation_failed", error=str(exc))
        return Orientation(decided_by="failed")
    if answer is None:
        return Orientation(decided_by="too_little_text")
    detected, confidence, script = answer[:3]
    if detected == 0 or confidence >= settings.threshold:
        return Orientation(detected, detected, confidence, "osd", script=script)
    if confidence < READ_FLOOR:
        return Orientation(0, detected, confidence, "low_confidence", script=script)
    try:
        best, read = reading.best(detected)
    except OSError as exc:
        log.warning("orientation_failed", error=str(exc))
        return Orientation(0, detected, confidence, "failed", script=script)
    return Orientation(best, detected, confidence, "reading", read=read, script=script)


class _Reading:
    """The reading check on one image, its rules made white (``unruled``): each turn read once
    (Tesseract, ``READ_LANG``), however many times it is asked about."""

    def __init__(self, image: Image.Image, dpi: float, folder: str, timeout: float) -> None:
        self._image, self._dpi, self._folder, self._timeout = image, dpi, folder, timeout
        self._unruled: Image.Image | None = None
        self._read: dict[int, int] = {}

    def best(self, detected: int) -> tuple[int, int]:
        """The turn to make and the most confident characters any turn read. The turns read are
        unturned, ``detected`` and its opposite (OSD unsure of a page on its side often has it
        the wrong way up); the best of them is made only where it reads ``READ_RATIO`` times as
        many as unturned, and ``READ_MIN_CHARACTERS``. Raises OSError."""
        counts = {
            clockwise: self._count(clockwise) for clockwise in (0, detected, (detected + 180) % 360)
        }
        best = max(counts, key=lambda clockwise: (counts[clockwise], clockwise == 0))
        enough = counts[best] >= max(READ_MIN_CHARACTERS, READ_RATIO * counts[0])
        return (best if enough else 0), counts[best]

    def _count(self, clockwise: int) -> int:
        if clockwise not in self._read:
            path = os.path.join(self._folder, f"read-{clockwise}.pgm")
            if self._unruled is None:
                self._unruled = unruled(self._image)
            turn(self._unruled, clockwise).save(path)
            self._read[clockwise] = readable_characters(path, self._dpi, self._timeout)
        return self._read[clockwise]


def glance(sample: Image.Image, dpi: float, folder: str, timeout: float) -> Answer | None:
    """OSD's answer on ``sample`` (``window``'s part of the page, scaled) from
    ``GLANCE_CHARACTERS`` characters: about a third of the whole page's cost. Trusted only when it
    says upright: a turned answer is checked by reading, then on the whole page."""
    path = os.path.join(folder, "glance.pgm")
    sample.save(path)
    return detect(path, dpi, timeout, characters=GLANCE_CHARACTERS)


def _scaled(image: Image.Image, scale: float) -> Image.Image:
    """``image`` scaled by ``scale`` (at most 1), averaging the pixels it merges."""
    if scale >= 1.0:
        return image
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.BOX)


def window(
    size: tuple[int, int], dpi: float, tiles: list[_Tile]
) -> tuple[tuple[int, int, int, int] | None, float]:
    """The box, in the pixels of the page ``tiles`` (``survey``'s) come from (``size``, at
    ``dpi``), of the window richest in text lines, ``GLANCE_SIDE`` pixels a side once scaled by
    the scale that makes its median line ``GLANCE_LINE`` pixels high: the text's own height,
    whatever the page's claimed DPI. (None, 1.0) where no text lines are found."""
    texts = [tile for tile in tiles if tile.text]
    if not texts:
        return None, 1.0
    per_ink = max(dpi, LINES_DPI) / LINES_DPI  # the page's pixels per pixel of ``_bilevel``'s
    per_tile = LINES_TILE * per_ink
    height = statistics.median(line[3] for tile in texts for line in tile.text)
    scale = min(1.0, GLANCE_LINE / (height * per_ink))
    side = max(1, round(GLANCE_SIDE / (per_tile * scale)))
    top, left = _densest({(tile.top, tile.left): len(tile.text) for tile in texts}, side)
    box = (
        round(left * per_tile),
        round(top * per_tile),
        min(size[0], round((left + side) * per_tile)),
        min(size[1], round((top + side) * per_tile)),
    )
    return box, scale


def _densest(counts: dict[tuple[int, int], int], side: int) -> tuple[int, int]:
    """The top-left tile (row, column) of the ``side`` x ``side`` window of tiles holding the most
    lines, ``counts`` giving each tile's."""
    height = max(top for top, _ in counts) + 1
    width = max(left for _, left in counts) + 1
    total = [[0] * (width + 1) for _ in range(height + 1)]  # prefix sums
    for r in range(height):
        for c in range(width):
            here = counts.get((r, c), 0)
            total[r + 1][c + 1] = here + total[r][c + 1] + total[r + 1][c] - total[r][c]
    best, at = -1, (0, 0)
    for r in range(max(1, height - side + 1)):
        for c in range(max(1, width - side + 1)):
            r2, c2 = min(height, r + side), min(width, c + side)
            count = total[r2][c2] - total[r][c2] - total[r2][c] + total[r][c]
            if count > best:
                best, at = count, (r, c)
    return at


def lines_say_upright(page: Image.Image, dpi: float) -> bool:
    """Whether ``page`` (grey) surely needs no turn, from its text lines alone (``_says_upright``):
    pure Pillow and Python, a few hundredths of a second a page."""
    return _says_upright(survey(_bilevel(page, dpi)), 0)


def turn_from_lines(tiles: list[_Tile]) -> int | None:
    """The clockwise turn after which the text lines ``survey`` found say upright, or None where
    no turn does. At most one can: the lines must run across the page twice as often as along
    it, and have more ink above their x-height band than below it."""
    for clockwise in (0, 180, 90, 270):
        if _says_upright(tiles, clockwise):
            return clockwise
    return None


@dataclass(frozen=True)
class _Tile:
    """A tile of the bilevel page inked within ``LINES_INK``: where it lies (in tiles), and the
    lines it holds whole down its rows and across its columns (right to left, as the tile turned
    counter-clockwise shows them), each as ``_lines`` gives it."""

    top: int
    left: int
    rows: list[tuple[int, int, float, int]]
    columns: list[tuple[int, int, float, int]]

    @property
    def text(self) -> list[tuple[int, int, float, int]]:
        """The lines of the direction that holds more of them."""
        return self.rows if len(self.rows) >= len(self.columns) else self.columns


def survey(ink: Image.Image) -> list[_Tile]:
    """Every tile of ``ink`` (``_bilevel``'s) inked enough to judge, with its lines both ways: one
    pass for all four turns and the glance's window. Each tile's row and column sums come from two
    box-filter shrinks of the page (a pixel a tile's row or column), not loops over pixels."""
    side = LINES_TILE
    least, most = (round(share * side * side) for share in LINES_INK)
    across, down = ink.width // side, ink.height // side
    if not across or not down:
        return []
    whole = ink.crop((0, 0, across * side, down * side)).point(lambda value: 255 * value)
    whole = whole.convert("F")
    by_row = array.array("f", whole.resize((across, down * side), Image.Resampling.BOX).tobytes())
    by_column = array.array(
        "f", whole.resize((across * side, down), Image.Resampling.BOX).tobytes()
    )
    per = side / 255  # a mean of 0/255 pixels over a tile's side, as a count of inked pixels
    found = []
    for top in range(down):
        for left in range(across):
            rows = [round(by_row[(top * side + y) * across + left] * per) for y in range(side)]
            if not least <= sum(rows) <= most:
                continue
            end = (top * across + left + 1) * side - 1  # the tile's last column, read first
            columns = [round(by_column[end - x] * per) for x in range(side)]
            found.append(_Tile(top, left, _lines(rows), _lines(columns)))
    return found


def _says_upright(tiles: list[_Tile], clockwise: int) -> bool:
    """Whether the page the tiles come from, turned ``clockwise``, has at least ``LINES_MIN`` lines
    across it, ``LINES_ACROSS`` times as many as along it, with a Latin x-height band
    (``LINES_CORE``) and ``LINES_ASCENDERS`` times as much ink above it as below. A quarter turn
    reads columns as rows; a turn of 180 or 90 clockwise reads each line upside down. A turn needs
    those lines from tiles in ``LINES_SPREAD`` rows and columns of tiles: one line of large letters
    has strokes that look like a few lines on their side, all in one row of tiles."""
    across = along = 0
    above = below = 0
    cores: list[float] = []
    spread: tuple[set[int], set[int]] = (set(), set())
    flip = clockwise in (90, 180)
    for tile in tiles:
        lines, columns = (
            (tile.rows, tile.columns) if clockwise in (0, 180) else (tile.columns, tile.rows)
        )
        if len(lines) >= 2 and len(lines) > LINES_ACROSS * len(columns):
            across += len(lines)
            spread[0].add(tile.top)
            spread[1].add(tile.left)
            for up, down, core, _ in lines:
                if flip:
                    up, down = down, up
                above, below = above + up, below + down
                cores.append(core)
        elif len(columns) >= 2 and len(columns) > LINES_ACROSS * len(lines):
            along += len(columns)
    if across < max(LINES_MIN, LINES_ACROSS * along):
        return False
    if clockwise and min(len(spread[0]), len(spread[1])) < LINES_SPREAD:
        return False
    low, high = LINES_CORE
    return (above + 1) >= LINES_ASCENDERS * (below + 1) and low <= statistics.median(cores) <= high


def _bilevel(page: Image.Image, dpi: float) -> Image.Image:
    """``page`` no finer than ``LINES_DPI``, 1 where it is ink (darker than mid-grey), else 0."""
    if dpi > LINES_DPI:
        scale = LINES_DPI / dpi
        size = (max(1, round(page.width * scale)), max(1, round(page.height * scale)))
        page = page.resize(size, Image.Resampling.BOX)
    return page.point(lambda value: 1 if value < 128 else 0)


def _lines(rows: list[int]) -> list[tuple[int, int, float, int]]:
    """Each band of inked rows that the tile holds whole and is a line's height: the ink above its
    dense middle, the ink below it, the middle's share of its height, and the height."""
    found = []
    start = None
    for index, count in enumerate([*rows, 0]):
        if count and start is None:
            start = index
        elif not count and start is not None:
            whole = start > 0 and index < len(rows)
            if whole and LINE_HEIGHT[0] <= index - start <= LINE_HEIGHT[1]:
                band = rows[start:index]
                dense = [at for at, value in enumerate(band) if 2 * value >= max(band)]
                first, last = dense[0], dense[-1]
                height = index - start
                found.append(
                    (sum(band[:first]), sum(band[last + 1 :]), (last - first + 1) / height, height)
                )
            start = None
    return found


def _surveyed(image: Image.Image, dpi: float) -> tuple[Image.Image, float, list[_Tile]]:
    """What detection reads (``_grey``), the DPI it reads it at, and ``survey``'s tiles. A page
    shrunk by the DPI it claims whose survey finds fewer than ``LINES_MIN`` lines, or lines under
    ``LINES_FINE`` high, may claim more than it has (a 150-dpi scan saying 600: its lines shrunk to
    a few pixels): it is surveyed again at half that DPI while that costs no more than
    ``LINES_MAX_PIXELS``, and the DPI whose survey finds the most lines is taken."""
    grey = image.convert("L")
    best: tuple[int, Image.Image, float, list[_Tile]] | None = None
    while True:
        page, page_dpi = _grey(grey, dpi)
        tiles = survey(_bilevel(page, page_dpi))
        heights = [line[3] for tile in tiles for line in tile.text]
        if best is None or len(heights) > best[0]:
            best = (len(heights), page, page_dpi, tiles)
        clear = len(heights) >= LINES_MIN and statistics.median(heights) >= LINES_FINE
        finer = dpi / 2
        pixels = grey.width * grey.height * min(1.0, LINES_DPI / finer) ** 2
        if clear or dpi <= LINES_DPI or pixels > LINES_MAX_PIXELS:
            return best[1:]
        dpi = finer


def _grey(image: Image.Image, dpi: float) -> tuple[Image.Image, float]:
    """What detection reads: the page in grey, no finer than ``OSD_MAX_DPI``."""
    grey = image if image.mode == "L" else image.convert("L")
    if dpi > OSD_MAX_DPI:
        scale = OSD_MAX_DPI / dpi
        size = (max(1, round(grey.width * scale)), max(1, round(grey.height * scale)))
        return grey.resize(size, Image.Resampling.BOX), float(OSD_MAX_DPI)
    return grey, dpi
