"""A text layer in reading order: two-column pages made here (poppler reads the one whose right
column starts higher out of order), a one-column page left as poppler wrote it, tables read by rows,
the order's rules on boxes, and the corpus's two-column paper and table against their references."""

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
from ocrwatch.pages.readingorder import PopplerBlock, PopplerLine
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


def tags(text: str, initials: str = "HLRT") -> list[str]:
    """The paragraphs' tags in the order ``text`` reads them, each run once."""
    found = [word[:2] for word in text.split() if word[:1] in initials]
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


def block(x0: float, y0: float, x1: float, y1: float, *lines: tuple[str, ...]) -> PopplerBlock:
    """A block of ``lines``, each as wide as the block, one under the other."""
    height = (y1 - y0) / len(lines)
    return PopplerBlock(
        x0,
        y0,
        x1,
        y1,
        tuple(
            PopplerLine(x0, y0 + n * height, x1, y0 + (n + 1) * height, words)
            for n, words in enumerate(lines)
        ),
    )


def table(top: float, rows: int) -> list[Placed]:
    """A table of three columns (cells ``A0 red apples``, ``B0 12``, ``C0 per kilo``; ``A1``... in
    the next row), one column drawn after the other as a spreadsheet's PDF does."""
    cells = [[f"A{n} red apples" for n in range(rows)], [f"B{n} 12" for n in range(rows)]]
    cells.append([f"C{n} per kilo" for n in range(rows)])
    return [(x, top, 10, column) for x, column in zip((54, 230, 406), cells, strict=True)]


def test_a_table_is_read_row_by_row(tmp_path: Path) -> None:
    """Poppler reads a table column by column (each column one block): a reader reads it by rows,
    each on a line of its own, the title above it first."""
    title: Placed = (54, 740, 14, ["Title of the price list"])
    text, result = arranged(write_pdf(tmp_path / "table.pdf", [title, *table(700, 8)]))
    rows = [[f"A{n}", f"B{n}", f"C{n}"] for n in range(8)]
    assert tags(text, "ABC")[:3] == ["A0", "A1", "A2"]
    assert tags(result, "TABC") == ["Ti", *(tag for row in rows for tag in row)]
    assert "A3 red apples B3 12 C3 per kilo" in result.splitlines()
    assert sorted(result.split()) == sorted(text.split())


def test_text_columns_under_a_table_are_read_column_by_column(tmp_path: Path) -> None:
    """A table as wide as the page over three text columns whose lines share their heights: the
    table by rows, then the columns, each top to bottom (their rows hold sentences, no cells)."""
    placed = table(740, 9)
    for tag, x in (("L0", 54), ("M0", 230), ("R0", 406)):
        words = [f"{tag}w{i}" for i in range(30)]
        placed.append((x, 600, 9, [" ".join(words[i : i + 5]) for i in range(0, 30, 5)]))
    result = arranged(write_pdf(tmp_path / "mixed.pdf", placed))[1]
    cells = [tag for n in range(9) for tag in (f"A{n}", f"B{n}", f"C{n}")]
    assert tags(result, "ABCLMR") == [*cells, "L0", "M0", "R0"]


def test_a_right_to_left_table_is_read_right_to_left() -> None:
    cells = [box(x, y, x + 150, y + 10, 1, "שלום") for y in (100, 120, 140) for x in (50, 250, 450)]
    assert read(cells) == [2, 1, 0, 5, 4, 3, 8, 7, 6]


def box(
    x0: float, y0: float, x1: float, y1: float, lines: int = 5, word: str = "w"
) -> PopplerBlock:
    return block(x0, y0, x1, y1, *((word,) for _ in range(lines)))


def read(blocks: list[PopplerBlock]) -> list[int]:
    """The blocks in the order ``readingorder.order`` reads their lines (each at its first)."""
    return list(dict.fromkeys(i for row in readingorder.order(blocks) for i, _ in row))


def test_cells_and_labels_keep_poppler_s_order() -> None:
    """A table's one-line cells side by side are no columns: poppler reads them by rows."""
    cells = [box(x, y, x + 150, y + 10, lines=1) for y in (100, 120, 140) for x in (50, 250, 450)]
    assert read(cells) == list(range(9))


def test_narrow_blocks_beside_paragraphs_are_no_column() -> None:
    """A contents page: titles and their page numbers, blocks of several lines side by side."""
    blocks = [box(90, 166, 519, 271), box(528, 166, 539, 271), box(90, 285, 519, 349)]
    blocks += [box(527, 285, 539, 349)]
    assert read(blocks) == [0, 1, 2, 3]


def test_right_to_left_columns_read_right_first() -> None:
    left, right = box(50, 110, 280, 300, word="שלום"), box(320, 100, 550, 300, word="שלום")
    assert read([left, right]) == [1, 0]
    latin = [box(50, 110, 280, 300), box(320, 100, 550, 300)]
    assert read(latin[::-1]) == [1, 0]


def test_a_hyphen_poppler_dropped_is_kept_when_blocks_move() -> None:
    """Poppler joins a line ending in a hyphen to the next line, the next block's first too; a
    block moved away from that next one gets its hyphen back."""
    lines = (("b", "c"), ("d", "e"))
    blocks = [
        block(320, 100, 550, 300, ("right", "a"), *lines, ("f", "col-")),
        block(50, 110, 280, 300, ("left", "a"), *lines, ("f", "g")),
    ]
    text = "right a\nb c\nd e\nf colleft a\nb c\nd e\nf g\n\n\f"
    want = "left a\nb c\nd e\nf g\n\nright a\nb c\nd e\nf col-\n\n\f"
    assert readingorder.arrange(text, blocks) == want
    blocks = [
        block(320, 100, 550, 300, ("right", "a"), *lines),
        block(50, 110, 280, 300, ("left", "a-"), *lines),
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
            text, result = page_arranged(path, index)
            want = in_columns(truth[index])
            before = similarity(pagetext.markdown(text), want)
            after = similarity(pagetext.markdown(result), want)
            assert after >= before, (entry["file"], index + 1, before, after)


def test_corpus_tables(corpus_dir: Path, manifest: list[dict[str, Any]]) -> None:
    """The born-digital tables with a reference (``pdftotext -layout``'s, a row on a line): read no
    worse than in poppler's order; issue-914-xmp-data.pdf's, which poppler reads column by column
    (0.30), as its reference reads it."""
    chosen = [
        e
        for e in manifest
        if e.get("has_text_layer") and "table" in e["tags"] and "academic_paper" not in e["tags"]
    ]
    if not chosen:
        pytest.skip("the corpus has no table with a text layer")
    for entry in chosen:
        truth = (corpus_dir / f"{entry['file']}.gt.txt").read_text().split("\f")
        for index in range(min(entry["pages"], len(truth))):
            text, result = page_arranged(corpus_dir / entry["file"], index)
            before = similarity(pagetext.markdown(text), truth[index])
            after = similarity(pagetext.markdown(result), truth[index])
            assert after >= before, (entry["file"], index + 1, before, after)
            if entry["file"] == "issue-914-xmp-data.pdf":
                assert after > 0.95, after


def page_arranged(path: Path, index: int) -> tuple[str, str]:
    """Poppler's text of page ``index`` of ``path``, and that text in reading order: the same
    words."""
    pages = ("-f", str(index + 1), "-l", str(index + 1))
    text = poppler(path, *pages)
    result = readingorder.arrange(text, readingorder.parse(poppler(path, "-bbox-layout", *pages)))
    assert result is not None, (path.name, index + 1)
    assert sorted(result.split()) == sorted(text.split())
    return text, result
