"""The skew of a scanned page: the small angle its text lines lean by, from a projection profile.

A page's ink, summed along each row, gives a profile with sharp peaks (the lines) and troughs (the
gaps between them) when the rows run along the lines, and a flat one when they cut across; the angle
that maximises the profile's variance is the one that levels the lines (Postl's method, what
Leptonica's ``pixFindSkew`` refines). It runs in Pillow's C code on a small copy of the page: each
candidate angle is one rotation of a ~1 megapixel bilevel image and one resize to a single column
(``Image.BOX`` averages each row), so no array library is needed. A coarse search over
``±MAX_ANGLE`` in ``COARSE_STEP`` steps is refined around its best angle to ``FINE_STEP``.
"""

from __future__ import annotations

import math

from PIL import Image, ImageStat

MAX_ANGLE = 5.0
"""The largest skew looked for, degrees: a scanner's feeder or a hand-placed page leans less; more
is a page placed sideways on purpose, which ``orientation`` turns by a right angle instead."""
COARSE_STEP = 0.5
FINE_STEP = 0.1
MIN_ANGLE = 0.1
"""Below this the page is left as it is: turning it only resamples the pixels (one pixel's lean over
~570 pixels of line, within a glyph's stroke)."""
WORK_SIDE = 1200
"""The long side of the copy the angle is measured on: 0.1 degrees moves a line's end by ~1.5 of its
pixels on a page's width, what the fine step needs to tell apart."""
WINDOW = 0.1
"""The share of each side left out of the score: what ``MAX_ANGLE`` turns in from the corners."""
MIN_GAIN = 1.02
"""How much more variance than the page as it is the best angle must give to count: a page without
lines of text (a photo, a blank page) has a flat score and keeps its pixels."""


def skew_angle(image: Image.Image) -> float:
    """The clockwise angle, degrees, that levels ``image``'s text lines (0.0: none found, or less
    than ``MIN_ANGLE``). Blocking, about a tenth of a second a page: call it in a worker thread."""
    ink = _ink(image)
    if ink is None:
        return 0.0
    cache: dict[float, float] = {}
    # Only the middle is scored: the corners turned in are empty and would favour the widest turn.
    width, height = ink.size
    window = (
        round(width * WINDOW),
        round(height * WINDOW),
        round(width * (1 - WINDOW)),
        round(height * (1 - WINDOW)),
    )

    def score(angle: float) -> float:
        angle = round(angle, 3)
        if angle not in cache:  # counter-clockwise, as Pillow turns: the lean is its negative
            turned = ink.rotate(angle, Image.Resampling.NEAREST, fillcolor=0).crop(window)
            profile = turned.resize((1, turned.height), Image.Resampling.BOX)
            cache[angle] = ImageStat.Stat(profile).var[0]
        return cache[angle]

    best = max(_steps(0.0, MAX_ANGLE, COARSE_STEP), key=score)
    best = max((a for a in _steps(best, COARSE_STEP, FINE_STEP) if abs(a) <= MAX_ANGLE), key=score)
    if abs(best) < MIN_ANGLE or score(best) < score(0.0) * MIN_GAIN:
        return 0.0
    return round(-best, 2)


def _steps(middle: float, reach: float, step: float) -> list[float]:
    """``middle`` and the angles ``step`` apart on either side of it, out to ``reach``."""
    count = round(reach / step)
    return [middle + i * step for i in range(-count, count + 1)]


def straighten(image: Image.Image, clockwise: float) -> Image.Image:
    """``image`` turned ``clockwise`` degrees about its centre, its size kept (the corners turned
    out of it are lost, those turned in are white), as OCRmyPDF's ``--deskew`` keeps a page's
    size."""
    white = 255 if image.mode == "L" else (255, 255, 255)
    return image.rotate(-clockwise, Image.Resampling.BICUBIC, fillcolor=white)


def _ink(image: Image.Image) -> Image.Image | None:
    """A small bilevel copy (as "L": 255 ink, 0 paper) at Otsu's threshold; None for a page of one
    tone."""
    grey = image.convert("L")
    scale = WORK_SIDE / max(grey.size)
    if scale < 1:
        size = (max(1, round(grey.width * scale)), max(1, round(grey.height * scale)))
        grey = grey.resize(size, Image.Resampling.BOX)
    threshold = _otsu(grey.histogram())
    if threshold is None:
        return None
    return grey.point([255 if value <= threshold else 0 for value in range(256)])


def _otsu(histogram: list[int]) -> int | None:
    """The grey level that best splits the histogram in two (between-class variance at its most)."""
    total = sum(histogram)
    weighted = sum(level * count for level, count in enumerate(histogram))
    below = below_weighted = 0
    best, threshold = 0.0, None
    for level, count in enumerate(histogram[:-1]):
        below += count
        below_weighted += level * count
        above = total - below
        if below == 0 or above == 0:
            continue
        mean_below, mean_above = below_weighted / below, (weighted - below_weighted) / above
        between = below * above * (mean_below - mean_above) ** 2
        if between > best:
            best, threshold = between, level
    return threshold if best > 0 and math.isfinite(best) else None
