"""The corpus's turned pages and what they say: shared by tests/test_orientation.py and
bench/orientation.py.

``TURNED``: each page (file, 1-based page) a viewer shows turned, and the clockwise degrees that
make it upright; every other page of the corpus is shown upright (``test Orient.pdf`` holds boxes of
text in four directions on an upright page, ``rotated_skew.pdf`` and ``AutoCad_Diagram.pdf`` are
turned by their /Rotate, which the renderer applies). ``REFERENCE``: the text each legible page
should read as, a file beside the corpus's documents, or a transcription written here where the
corpus has none (``ocr_test_rotated_90.pdf``: its three printed lines, read by eye).
"""

from __future__ import annotations

import re
from pathlib import Path

from rapidfuzz.distance import Levenshtein

PANGRAMS = (
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs now.",
    "Sphinx of black quartz, judge my solemn vow.",
    "How vexingly quick daft zebras jump today!",
    "Bright vixens jump; dozy fowl quack loudly.",
    "Waltz, bad nymph, for quick jigs vex them.",
    "Jackdaws love my big sphinx of quartz too.",
    "The five boxing wizards jump very quickly.",
)
"""Lines of text that use most letters: a page of them reads the same upright, whatever the font."""

TURNED: dict[tuple[str, int], int] = {
    ("cardinal.pdf", 2): 270,
    ("cardinal.pdf", 3): 180,
    ("cardinal.pdf", 4): 90,
    ("ocr_test_rotated_90.pdf", 1): 90,
    ("devatest-rotated-270.png", 1): 90,
}

ROTATED_DOCUMENTS = (
    "ocr_test_rotated_90.pdf",
    "devatest-rotated-270.png",
    "test Orient.pdf",
    "rotated_skew.pdf",
    "issue-914-xmp-data.pdf",
    "cardinal.pdf",
)
"""The issue's five and cardinal.pdf (linn.pdf's page four ways round)."""

OCR_TEST_ROTATED_90 = (
    "Docling bundles PDF document conversion to JSON and Markdown in an easy self contained package"
)

REFERENCE: dict[str, str] = {
    "cardinal.pdf": "linn.pdf.ref.txt",
    "rotated_skew.pdf": "linn.pdf.ref.txt",
    "test Orient.pdf": "test Orient.pdf.gt.txt",
}
"""Files of the corpus holding a document's text (every page of cardinal.pdf is linn.pdf's)."""

LEGIBLE = ("cardinal.pdf", "rotated_skew.pdf", "ocr_test_rotated_90.pdf")
"""The rotated documents Tesseract's ``eng`` can read once upright: ``test Orient.pdf`` is text in
four directions on one page (whichever way it is read, three quarters are turned),
``devatest-rotated-270.png`` is Hindi and ``issue-914-xmp-data.pdf`` Chinese, whose language data
the test machines lack."""

_WORD = re.compile(r"[\w']+")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def reference(corpus: Path, name: str) -> str:
    """The text ``name`` should read as."""
    if name == "ocr_test_rotated_90.pdf":
        return OCR_TEST_ROTATED_90
    return (corpus / REFERENCE[name]).read_text(encoding="utf-8")


def words(text: str) -> list[str]:
    """Lower-case words, punctuation, Markdown marks and comments (``<!-- page N -->``) left out."""
    return _WORD.findall(_COMMENT.sub(" ", text).lower().replace("-\n", ""))


def word_similarity(got: str, want: str) -> float:
    """1 - the word-level edit distance over the longer text's words: order-sensitive, 1.0 when
    every word is read and in order."""
    return Levenshtein.normalized_similarity(words(got), words(want))


def bag_similarity(got: str, want: str) -> float:
    """The share of words in common, whatever their order (a two-column page read across)."""
    have, need = words(got), words(want)
    counts: dict[str, int] = {}
    for word in need:
        counts[word] = counts.get(word, 0) + 1
    common = 0
    for word in have:
        if counts.get(word, 0) > 0:
            counts[word] -= 1
            common += 1
    return 2 * common / max(len(have) + len(need), 1)
