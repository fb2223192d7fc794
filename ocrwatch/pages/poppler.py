"""What poppler's programs say, in ocrwatch's words: a complaint mapped onto the error kinds, an
allocation that failed, and data poppler lacks to draw a page's text (``poppler-data``: the
encodings of fonts a PDF names without embedding, Chinese, Japanese and Korean ones among them,
whose text is otherwise drawn blank and extracted as dots).
"""

from __future__ import annotations

import re
from pathlib import Path

from ocrwatch.errors import (
    CorruptPdf,
    EmptyFile,
    EncryptedPdf,
    NoPages,
    OcrwatchError,
    PermanentError,
    SourceGone,
)

NO_PAGES = "the PDF has no page that can be rendered: its page tree is empty or damaged"
"""What ``no_pages`` says, in place of poppler's own words for it ("Wrong page range given: the
first page (1) can not be after the last page (0)"), which name a range no user gave."""


def pdf_error(path: Path, stderr: str) -> PermanentError:
    """Map poppler's complaint onto the error kinds.

    Zero pages is ``no_pages`` even when the page tree is also malformed
    (issue15590_zero_pages.pdf): the file holds no page objects at all, so no repair could recover a
    page, and the corrupt_pdf hint would mislead.
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    detail = lines[-1] if lines else "poppler could not read it"
    text = stderr.lower()
    if "incorrect password" in text:
        return EncryptedPdf(f"{path}: the PDF is encrypted and needs a password")
    if "last page (0)" in text or "invalid page count 0" in text:
        return NoPages(f"{path}: {NO_PAGES}")
    if "document stream is empty" in text:
        return EmptyFile(f"{path}: zero bytes")
    if "couldn't open file" in text:
        return SourceGone(f"{path}: {detail}")
    return CorruptPdf(f"{path}: {detail}")


def missing() -> OcrwatchError:
    """pdfinfo or pdftoppm not on PATH: no document can be read until poppler-utils is installed."""
    return OcrwatchError(
        "pdfinfo/pdftoppm not found", hint="install poppler-utils; `ocrwatch check` verifies it"
    )


# What poppler, openjpeg and the C++ runtime say when an allocation fails.
OUT_OF_MEMORY = re.compile(
    r"out of memory|not enough memory|exceeds system limits|bad_alloc|cannot allocate",
    re.IGNORECASE,
)

_MISSING_DATA = re.compile(r"Missing language pack for '([^']+)' mapping")


def missing_data(stderr: str) -> str | None:
    """The character collection (``Adobe-Japan1``) poppler had no data for while drawing a page,
    whose text in it is drawn blank; None where it had all it needed."""
    found = _MISSING_DATA.search(stderr)
    return found.group(1) if found else None
