"""Pages turned upright before they are read: Tesseract's orientation detection, and deskew.

Every rendered page, for either engine, goes through ``upright`` in its render worker (blocking, off
the event loop). With ``[render] rotate_pages``, Tesseract's orientation and script detection
(``--psm 0``, the ``osd`` data) says by how many right angles the page is turned and how sure it is.
OSD's confidence is the margin between its best orientation and the next; on a page with little
text it is small and often wrong (a test page of a few sideways boxes reads as upside down at
1.9, where a three-line page turned 90 degrees reads right at 2.7), so its answer is taken in three
bands:

- at ``rotate_pages_threshold`` or above (14 by default, OCRmyPDF's ``--rotate-pages-threshold``):
  as it is;
- from ``READ_FLOOR`` up to the threshold: checked by reading the page both ways (Tesseract,
  ``READ_LANG``) and turned only when turned it reads at least ``READ_RATIO`` times as many
  characters of confident words (``READ_CONFIDENCE``) as it does unturned;
- below ``READ_FLOOR``, or no answer at all (too few characters): kept as it is.

With ``[render] deskew`` the upright page is then levelled by the small angle ``deskew`` finds.
The page the engine reads, its blocks' boxes and its figures are the upright image's; ``to_shown``
gives the map from those pixels back to the page as rendered (as a viewer shows it), which the
searchable PDF's text layer is placed through.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

import structlog
from PIL import Image

from ocrwatch import children, deskew
from ocrwatch.errors import ConfigError

log = structlog.get_logger()

BINARY = "tesseract"
"""The Tesseract that detects orientation: the one on PATH, whichever engine reads the pages."""
OSD_MAX_DPI = 300
"""A page rendered finer is shrunk to this for detection: OSD is trained on 300 dpi text."""
READ_FLOOR = 1.0
"""OSD's confidence below which a turned answer is not even checked (upright pages of little text
are read turned at 0.2 to 0.5 confidence: a map, a chart, a title page)."""
READ_LANG = "eng"
"""The language the check reads in: Latin letters of any language read confidently in it, and a
page of another script still reads more of them upright than on its side."""
READ_CONFIDENCE = 70.0
READ_RATIO = 2.0
READ_MIN_CHARACTERS = 10
"""A turned page must read at least this many characters of confident words to be turned."""

DecidedBy = Literal["osd", "reading", "low_confidence", "too_little_text", "failed"]
"""How a page's rotation was decided: OSD's answer as it is, the reading check, or kept as it is
because OSD was unsure, found too few characters, or could not run (the log says why)."""

_T = Image.Transpose
_TURN = {90: _T.ROTATE_270, 180: _T.ROTATE_180, 270: _T.ROTATE_90}  # clockwise to Pillow's turns


@dataclass(frozen=True)
class Orientation:
    """What was done to a page to read it: ``rotation`` clockwise degrees (a right angle), then
    ``deskew`` clockwise degrees about its centre (None: deskew is off). ``detected`` is OSD's
    answer (clockwise degrees that make it upright) and ``confidence`` its margin; both None where
    OSD did not run or gave no answer."""

    rotation: int = 0
    detected: int | None = None
    confidence: float | None = None
    decided_by: DecidedBy | None = None
    deskew: float | None = None
    seconds: float = 0.0

    @property
    def turned(self) -> bool:
        return self.rotation != 0 or bool(self.deskew)


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
    rotation, detected, confidence, decided_by = 0, None, None, None
    if settings.rotate:
        rotation, detected, confidence, decided_by = _decide(image, dpi, settings)
        image = turn(image, rotation)
    skew = None
    if settings.deskew:
        skew = deskew.skew_angle(image)
        if skew:
            image = deskew.straighten(image, skew)
    seconds = time.perf_counter() - started
    return image, Orientation(rotation, detected, confidence, decided_by, skew, seconds)


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


def _decide(
    image: Image.Image, dpi: float, settings: Settings
) -> tuple[int, int | None, float | None, DecidedBy]:
    """The rotation to apply, OSD's answer and confidence, and which band decided (module
    docstring)."""
    with tempfile.TemporaryDirectory(prefix="ocrwatch-osd-") as folder:
        page, page_dpi = _grey(image, dpi)
        path = os.path.join(folder, "page.pgm")
        page.save(path)
        try:
            answer = detect(path, page_dpi, settings.timeout)
        except OSError as exc:  # a crashed or killed Tesseract, a full temporary folder
            log.warning("orientation_failed", error=str(exc))
            return 0, None, None, "failed"
        if answer is None:
            return 0, None, None, "too_little_text"
        detected, confidence = answer
        if detected == 0 or confidence >= settings.threshold:
            return detected, detected, confidence, "osd"
        if confidence < READ_FLOOR:
            return 0, detected, confidence, "low_confidence"
        try:
            unturned = readable_characters(path, page_dpi, settings.timeout)
            turned_path = os.path.join(folder, "turned.pgm")
            turn(page, detected).save(turned_path)
            turned = readable_characters(turned_path, page_dpi, settings.timeout)
        except OSError as exc:
            log.warning("orientation_failed", error=str(exc))
            return 0, detected, confidence, "failed"
    better = turned >= max(READ_MIN_CHARACTERS, READ_RATIO * unturned)
    return (detected if better else 0), detected, confidence, "reading"


def _grey(image: Image.Image, dpi: float) -> tuple[Image.Image, float]:
    """What detection reads: the page in grey, no finer than ``OSD_MAX_DPI``."""
    grey = image.convert("L")
    if dpi > OSD_MAX_DPI:
        scale = OSD_MAX_DPI / dpi
        size = (max(1, round(grey.width * scale)), max(1, round(grey.height * scale)))
        return grey.resize(size, Image.Resampling.BOX), float(OSD_MAX_DPI)
    return grey, dpi


def detect(path: str, dpi: float, timeout: float) -> tuple[int, float] | None:
    """OSD's answer for the page image at ``path``: the clockwise degrees that make it upright and
    the confidence; None when it finds too few characters to say. Raises OSError when Tesseract
    fails."""
    done = _tesseract([path, "-", "--psm", "0", "--dpi", str(round(dpi))], timeout)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace")
        if "too few characters" in said.lower():
            return None
        tail = said.strip()[-300:]
        raise OSError(f"tesseract --psm 0 exited with status {done.returncode}: {tail}")
    return parse_osd(done.stdout.decode("utf-8", "replace"))


def parse_osd(text: str) -> tuple[int, float] | None:
    """``Rotate`` and ``Orientation confidence`` from ``tesseract --psm 0``'s report; None without
    them."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        rotate = int(fields["Rotate"].strip()) % 360
        confidence = float(fields["Orientation confidence"].strip())
    except (KeyError, ValueError):
        return None
    if rotate not in (0, 90, 180, 270) or not math.isfinite(confidence):
        return None
    return rotate, confidence


def readable_characters(path: str, dpi: float, timeout: float) -> int:
    """Characters in the words Tesseract reads at ``READ_CONFIDENCE`` or more on the page at
    ``path``, in ``READ_LANG``: a page on its side or upside down reads as few confident words. The
    page is read as one block of horizontal lines (``--psm 6``): the automatic layout (``--psm 3``)
    finds vertical lines and reads a page on its side as well as upright."""
    argv = [path, "-", "--psm", "6", "--dpi", str(round(dpi)), "-l", READ_LANG, "tsv"]
    done = _tesseract(argv, timeout)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip()[-300:]
        raise OSError(f"tesseract exited with status {done.returncode}: {said}")
    count = 0
    for row in done.stdout.decode("utf-8", "replace").splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) == 12 and fields[0] == "5" and fields[11].strip():
            try:
                if float(fields[10]) >= READ_CONFIDENCE:
                    count += len(fields[11].strip())
            except ValueError:
                continue
    return count


def _tesseract(args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """One Tesseract run with one thread (the render workers are the parallelism); a deadline passed
    or the program missing is an OSError, as a crash is."""
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        done = children.run([BINARY, *args], timeout=timeout, env=env, **pipes)
    except subprocess.TimeoutExpired:
        raise OSError(f"tesseract took longer than {timeout:g}s") from None
    if done.returncode < 0:
        raise OSError(f"tesseract was killed by signal {-done.returncode}")
    return done
