"""A text layer in reading order: two-column pages made here (poppler reads the one whose right
column starts higher out of order), a one-column page left as poppler wrote it, the order's rules on
boxes, and the corpus's two-column paper against its columns read in order."""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from pikepdf import Name

from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages import readingorder
from ocrwatch.pages.readingorder import PopplerBlock
from ocrwatch.recognize import pagetext
from tests.test_pagetext import KNOWN

Placed = tuple[float, float, float, list[str]]
"""Lines set at (x, y of the first baseline from the page's foot, font size, lines)."""


def paragraph(tag: str, lines: int) -> list[str]:
    """``lines`` lines of five words, each marked with ``tag`` (``L0``: the left column's first)."""
    words = [f"{tag}word{i}" for i in range(lines * 5)]
    return [" ".join(words[i : i + 5]) for i in range(0, len(words), 5)]


def write_pdf(path: Path, placed: list[Placed]) -> Path:
    """A one-page Letter PDF of Helvetica lines, drawn in the order given."""
    ops = []
    for x, y, size, lines in placed:
        ops.append(f"BT /F1 {size} Tf {size * 1.2:.2f} TL {x} {y} Td")
        ops += [f"({line}) Tj T*" for line in lines]
        ops.append("ET")
    with pikepdf.new() as pdf:
        font = pdf.make_indirect(
            pikepdf.Dictionary(Type=Name.Font, Subtype=Name.Type1, BaseFont=Name.Helvetica)
        )
        page = pikepdf.Dictionary(
            Type=Name.Page,
            MediaBox=[0, 0, 612, 792],
            Resources=pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font)),
            Contents=pdf.make_stream("\n".join(ops).encode()),
        )
        pdf.pages.append(pikepdf.Page(page))
        pdf.save(path)
    return path


def two_columns(heading: Placed | None = None) -> list[Placed]:
    """A left column opening with a section heading, its paragraphs, and a right column whose first
    paragraph starts 4 points above the heading: poppler reads that paragraph first."""
    left: list[Placed] = [(54, 700, 12, ["Hsection Introduction"])]
    left += [(54, 677.6, 9, paragraph("L0", 6)), (54, 602.8, 9, paragraph("L1", 6))]
    left += [(54, 524.0, 9, paragraph("L2", 3))]
    right: list[Placed] = [(320, 704, 9, paragraph("R0", 2)), (320, 668.4, 9, paragraph("R1", 4))]
    right += [(320, 615.2, 9, paragraph("R2", 6))]
    return ([heading] if heading else []) + left + right


def tags(text: str) -> list[str]:
    """The paragraphs' tags in the order ``text`` reads them, each run once."""
    found = [word[:2] for word in text.split() if word[:1] in "HLRT"]
    return [tag for i, tag in enumerate(found) if i == 0 or found[i - 1] != tag]


def poppler(path: Path, *options: str) -> str:
    return subprocess.run(
        ["pdftotext", "-q", "-enc", "UTF-8", *options, str(path), "-"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout


def arranged(path: Path) -> tuple[str, str]:
    """Poppler's text of ``path``, and that text in reading order."""
    text = poppler(path)
    result = readingorder.arrange(text, readingorder.parse(poppler(path, "-bbox-layout")))
    assert result is not None
    return text, result


def test_right_column_starting_higher_is_read_after_the_left(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "two.pdf", two_columns())
    text, result = arranged(path)
    assert tags(text)[:3] == ["Hs", "R0", "L0"]  # poppler's order, which the issue reports
    assert tags(result) == ["Hs", "L0", "L1", "L2", "R0", "R1", "R2"]
    assert sorted(result.split()) == sorted(text.split())


def test_heading_across_both_columns_comes_first(tmp_path: Path) -> None:
    title = (54.0, 740.0, 14.0, ["Title of this paper spanning both of the columns below it"])
    path = write_pdf(tmp_path / "titled.pdf", two_columns(title))
    assert tags(arranged(path)[1]) == ["Ti", "Hs", "L0", "L1", "L2", "R0", "R1", "R2"]


def test_a_taken_layer_is_in_reading_order(tmp_path: Path) -> None:
    """Through the text check, as the render workers take a page's own text."""
    path = write_pdf(tmp_path / "two.pdf", two_columns())
    found = pagetext.check(path, 0, "layer", "eng", KNOWN, budget=DecodeBudget(1 << 28), timeout=60)
    assert found.reason == "asked" and found.text is not None
    assert tags(pagetext.markdown(found.text)) == ["Hs", "L0", "L1", "L2", "R0", "R1", "R2"]


def test_one_column_page_is_poppler_s_text(tmp_path: Path) -> None:
    placed: list[Placed] = [(72, 720, 14, ["Title"]), (72, 690, 10, paragraph("L0", 8))]
    placed += [(72, 580, 10, paragraph("L1", 5)), (500, 60, 9, ["17"])]
    text, result = arranged(write_pdf(tmp_path / "one.pdf", placed))
    assert result == text


def box(
    x0: float, y0: float, x1: float, y1: float, lines: int = 5, word: str = "w"
) -> PopplerBlock:
    return PopplerBlock(x0, y0, x1, y1, tuple((word,) for _ in range(lines)))


def test_cells_and_labels_keep_poppler_s_order() -> None:
    """A table's one-line cells side by side are no columns: poppler reads them by rows."""
    cells = [box(x, y, x + 150, y + 10, lines=1) for y in (100, 120, 140) for x in (50, 250, 450)]
    assert readingorder.order(cells) == list(range(9))


def test_narrow_blocks_beside_paragraphs_are_no_column() -> None:
    """A contents page: titles and their page numbers, blocks of several lines side by side."""
    blocks = [box(90, 166, 519, 271), box(528, 166, 539, 271), box(90, 285, 519, 349)]
    blocks += [box(527, 285, 539, 349)]
    assert readingorder.order(blocks) == [0, 1, 2, 3]


def test_right_to_left_columns_read_right_first() -> None:
    left, right = box(50, 110, 280, 300, word="שלום"), box(320, 100, 550, 300, word="שלום")
    assert readingorder.order([left, right]) == [1, 0]
    latin = [box(50, 110, 280, 300), box(320, 100, 550, 300)]
    assert readingorder.order(latin[::-1]) == [1, 0]


def test_a_hyphen_poppler_dropped_is_kept_when_blocks_move() -> None:
    """Poppler joins a line ending in a hyphen to the next line, the next block's first too; a
    block moved away from that next one gets its hyphen back."""
    lines = (("b", "c"), ("d", "e"))
    blocks = [
        PopplerBlock(320, 100, 550, 300, (("right", "a"), *lines, ("f", "col-"))),
        PopplerBlock(50, 110, 280, 300, (("left", "a"), *lines, ("f", "g"))),
    ]
    text = "right a\nb c\nd e\nf colleft a\nb c\nd e\nf g\n\n\f"
    want = "left a\nb c\nd e\nf g\n\nright a\nb c\nd e\nf col-\n\n\f"
    assert readingorder.arrange(text, blocks) == want
    blocks = [
        PopplerBlock(320, 100, 550, 300, (("right", "a"), *lines)),
        PopplerBlock(50, 110, 280, 300, (("left", "a-"), *lines)),
    ]
    text = "right a\nb c\nd e\nleft ab c\nd e\n\n\f"
    assert readingorder.arrange(text, blocks) == "left ab c\nd e\n\nright a\nb c\nd e\n\n\f"


def test_words_that_differ_keep_poppler_s_order() -> None:
    blocks = [box(320, 100, 550, 300), box(50, 110, 280, 300)]
    assert readingorder.arrange("w w w w w v w w w w", blocks) is None


# --- the corpus --------------------------------------------------------------------------------


def in_columns(page: str) -> str:
    """A ``pdftotext -layout`` page read column by column: the gutter is the character column
    with the most lines of text on both sides of three spaces; a line without that gap (a title,
    a figure across the page) ends a band."""
    lines = page.splitlines()
    width = max((len(line) for line in lines), default=0)

    def split(line: str, at: int) -> bool:
        return line[at - 1 : at + 2] == "   " and bool(line[:at].strip() and line[at:].strip())

    at = max(
        range(int(width * 0.3), int(width * 0.7) + 1),
        key=lambda at: sum(split(line, at) for line in lines),
    )
    out: list[str] = []
    left: list[str] = []
    right: list[str] = []
    for line in lines:
        if len(line) <= at or not line[at - 1 : at + 2].strip():
            left.append(line[:at])
            right.append(line[at:])
        else:
            out += [*left, *right, line]
            left, right = [], []
    return "\n".join([*out, *left, *right])


def similarity(got: str, want: str) -> float:
    """Order-sensitive word similarity (difflib's ratio over the words)."""
    return difflib.SequenceMatcher(None, got.split(), want.split(), autojunk=False).ratio()


def test_corpus_two_column_layers(corpus_dir: Path, manifest: list[dict[str, Any]]) -> None:
    """The born-digital papers' pages with a reference: the same words, read no worse against
    their columns in order (tracemonkey.pdf's page 2: 0.970 in poppler's order, 0.978 now)."""
    chosen = [
        e
        for e in manifest
        if e.get("has_text_layer") and {"academic_paper", "two_column"} & set(e["tags"])
    ]
    if not chosen:
        pytest.skip("the corpus has no two-column document with a text layer")
    for entry in chosen:
        path = corpus_dir / entry["file"]
        truth = (corpus_dir / f"{entry['file']}.gt.txt").read_text().split("\f")
        for index in range(min(entry["pages"], len(truth))):
            if not truth[index].strip():
                continue
            pages = ("-f", str(index + 1), "-l", str(index + 1))
            text = poppler(path, *pages)
            result = readingorder.arrange(
                text, readingorder.parse(poppler(path, "-bbox-layout", *pages))
            )
            assert result is not None, (entry["file"], index + 1)
            assert sorted(result.split()) == sorted(text.split())
            want = in_columns(truth[index])
            before = similarity(pagetext.markdown(text), want)
            after = similarity(pagetext.markdown(result), want)
            assert after >= before, (entry["file"], index + 1, before, after)
