"""Tesseract's orientation and script detection (``--psm 0``, OSD), and the language a script asks.

OSD reports, for a page image, the turn that makes it upright with its confidence, and the script
its characters are in (``Script: Cyrillic``) with its own confidence. ``orientation`` asks it
whether a page is turned; the script it names on the way picks the page's Tesseract language where
an inbox reads ``lang = "auto"`` (``language``), and tells a page whose script no installed
language reads (``package`` names what would). Also here: the confident characters Tesseract reads
on a page image (``readable_characters``), by which ``orientation`` checks an unsure answer, and
the image with a table's rules made white for that reading (``unruled``).
"""

from __future__ import annotations

import math
import os
import subprocess
from typing import NamedTuple

from PIL import Image, ImageDraw

from ocrwatch.infra import children

BINARY = "tesseract"
"""The Tesseract that detects orientation: the one on PATH, whichever engine reads the pages."""
READ_LANG = "eng"
"""The language the check reads in: Latin letters of any language read confidently in it, and a
page of another script still reads more of them upright than on its side."""
READ_CONFIDENCE = 70.0
RULE_LENGTH = 400
"""The length, in pixels of the reading check's image (its lines some 30 pixels high), of an
unbroken run of ink taken for a rule and made white (``unruled``); runs under half of it never
are: a word's strokes, even Devanagari's headline, break between words."""

AUTO = "auto"
"""The ``lang`` that has each page read in the language of the script OSD finds on it."""
FALLBACK = "eng"
"""What ``auto`` reads a Latin page in, and a page whose script no installed language reads (or
whose script is unknown)."""
LATIN = "Latin"

LANGUAGES: dict[str, tuple[str, ...]] = {
    "Cyrillic": ("rus", "ukr", "bul", "srp", "bel", "mkd", "kaz"),
    "Greek": ("ell", "grc"),
    "Arabic": ("ara", "fas", "urd"),
    "Hebrew": ("heb", "yid"),
    "Han": ("chi_sim", "chi_tra"),
    "Japanese": ("jpn",),
    "Korean": ("kor",),
    "Hangul": ("kor",),
    "Devanagari": ("hin", "mar", "nep", "san"),
    "Bengali": ("ben", "asm"),
    "Tamil": ("tam",),
    "Telugu": ("tel",),
    "Kannada": ("kan",),
    "Malayalam": ("mal",),
    "Gujarati": ("guj",),
    "Gurmukhi": ("pan",),
    "Oriya": ("ori",),
    "Sinhala": ("sin",),
    "Thai": ("tha",),
    "Lao": ("lao",),
    "Khmer": ("khm",),
    "Myanmar": ("mya",),
    "Tibetan": ("bod",),
    "Armenian": ("hye",),
    "Georgian": ("kat",),
    "Ethiopic": ("amh",),
}
"""Each script OSD names (other than Latin and Fraktur) and the Tesseract languages that read it,
the likeliest first: ``auto`` reads a page in the first of them installed."""
_NOT_LATIN = frozenset(lang for langs in LANGUAGES.values() for lang in langs)


class Answer(NamedTuple):
    """OSD's report: the clockwise degrees that make the page upright, and its confidence; the
    script and its confidence, None where the report names none."""

    rotate: int
    confidence: float
    script: str | None = None
    script_confidence: float | None = None


def language(script: str | None, installed: frozenset[str]) -> tuple[str, str | None]:
    """The Tesseract languages ``auto`` reads a page of ``script`` in, among ``installed``, and the
    package that would read it where none installed does (else None): Latin, an unknown script
    and no script at all read in ``FALLBACK``; another script in its first installed language and
    ``FALLBACK`` (``ukr+eng``), as OSD names Cyrillic for some Latin pages (a photo of a street
    sign, a few large words) and pages of other scripts hold Latin words too."""
    if script not in LANGUAGES:
        return FALLBACK, None
    found = [lang for lang in LANGUAGES[script] if lang in installed]
    return (f"{found[0]}+{FALLBACK}", None) if found else (FALLBACK, package(script))


def latin(installed: frozenset[str]) -> str:
    """The installed languages of Latin script joined (``deu+eng``): what ``auto`` judges a text
    layer's words by, before any page's script is known."""
    return "+".join(sorted(installed - _NOT_LATIN - {"osd"})) or FALLBACK


def package(script: str) -> str | None:
    """The Debian package of the likeliest language of ``script``; None for Latin or unknown."""
    if script not in LANGUAGES:
        return None
    return f"tesseract-ocr-{LANGUAGES[script][0].replace('_', '-')}"


def reads(lang: str, script: str | None) -> bool:
    """Whether the languages ``lang`` (``deu+eng``) read ``script``: one of them is a language of
    it (for Latin, Fraktur or an unknown script: any language not of another script)."""
    names = set(lang.split("+"))
    if script not in LANGUAGES:
        return bool(names - _NOT_LATIN)
    return bool(names & set(LANGUAGES[script]))


def detect(path: str, dpi: float, timeout: float, characters: int | None = None) -> Answer | None:
    """OSD's answer for the page image at ``path``; None when it finds too few characters to say.
    ``characters``: how many it classifies at least (Tesseract's ``min_characters_to_try``, 50
    unless given; it goes on to five times as many until sure). Raises OSError when Tesseract
    fails."""
    argv = [path, "-", "--psm", "0", "--dpi", str(round(dpi))]
    if characters is not None:
        argv += ["-c", f"min_characters_to_try={characters}"]
    done = tesseract(argv, timeout)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace")
        if "too few characters" in said.lower():
            return None
        tail = said.strip()[-300:]
        raise OSError(f"tesseract --psm 0 exited with status {done.returncode}: {tail}")
    return parse_osd(done.stdout.decode("utf-8", "replace"))


def parse_osd(text: str) -> Answer | None:
    """``Rotate`` and ``Orientation confidence`` from ``tesseract --psm 0``'s report, with
    ``Script`` and ``Script confidence`` where it gives them; None without the first two."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        rotate = int(fields["Rotate"].strip()) % 360
        confidence = float(fields["Orientation confidence"].strip())
    except (KeyError, ValueError):
        return None
    if rotate not in (0, 90, 180, 270) or not math.isfinite(confidence):
        return None
    script = fields.get("Script", "").strip() or None
    try:
        said = float(fields.get("Script confidence", "").strip())
    except ValueError:
        said = None
    return Answer(rotate, confidence, script, said if said is None or math.isfinite(said) else None)


def readable_characters(path: str, dpi: float, timeout: float) -> int:
    """Characters in the words Tesseract reads at ``READ_CONFIDENCE`` or more on the page at
    ``path``, in ``READ_LANG``: a page on its side or upside down reads as few confident words. The
    page is read as one block of horizontal lines (``--psm 6``): the automatic layout (``--psm 3``)
    finds vertical lines and reads a page on its side as well as upright."""
    argv = [path, "-", "--psm", "6", "--dpi", str(round(dpi)), "-l", READ_LANG, "tsv"]
    done = tesseract(argv, timeout)
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


def unruled(image: Image.Image) -> Image.Image:
    """``image`` (grey) with every row and column of pixels that holds a rule (``_ruled``) made
    white: a table's rules and frame, inside which Tesseract reads no lines (a framed table on its
    side read 0 confident characters upright, as sideways)."""
    ink = image.point(lambda value: 255 if value < 128 else 0)
    rows, columns = _ruled(ink), _ruled(ink.transpose(Image.Transpose.TRANSPOSE))
    if not rows and not columns:
        return image
    clean = image.copy()
    draw = ImageDraw.Draw(clean)
    for y in rows:
        draw.line((0, y, clean.width - 1, y), fill=255)
    for x in columns:
        draw.line((x, 0, x, clean.height - 1), fill=255)
    return clean


def _ruled(ink: Image.Image) -> list[int]:
    """The rows of ``ink`` (255 ink, else 0) with a run of ink ``RULE_LENGTH`` long: each row cut
    into pieces half that long, shrunk to one pixel each (a box filter), and any piece all ink."""
    piece = RULE_LENGTH // 2
    pieces = ink.width // piece
    if not pieces:
        return []
    whole = ink.crop((0, 0, pieces * piece, ink.height))
    shrunk = whole.resize((pieces, ink.height), Image.Resampling.BOX).tobytes()
    return sorted({index // pieces for index, value in enumerate(shrunk) if value == 255})


def tesseract(args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
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
