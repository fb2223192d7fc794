"""NAME.hocr: every file parses (as XHTML and as HTML), with Tesseract's classes and ``bbox``
titles: words, their boxes and confidences from a page Tesseract reads now; DeepSeek-OCR's block
boxes, its lines and words without one; a turned page's ``textangle``, a skewed one's ``baseline``;
``scan_res`` where the DPI is known. OCRmyPDF's own hOCR reader makes from it a text layer with our
words in our order where we put them."""

from __future__ import annotations

import html
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import lxml.html
import pypdf
import pytest
from lxml import etree

from ocrwatch.pages import orientation
from ocrwatch.results import hocr, positions
from tests.support.layout_pages import (
    DPI,
    LINES,
    SIZE,
    deepseek_outcome,
    outcome,
    tesseract_blocks,
    tesseract_read,
    words,
)

ENGINE = {"name": "tesseract", "version": "5.3.0", "lang": "eng"}


def made(*outcomes: Any, engine: dict[str, Any] = ENGINE) -> Any:
    """The hOCR file of these pages, parsed as HTML once it parsed as XML."""
    data = hocr.document(positions.pages(outcomes), "report.pdf", engine)
    assert etree.fromstring(data).tag == f"{{{hocr.NAMESPACE}}}html"
    return lxml.html.document_fromstring(data)


def classed(tree: Any, kind: str) -> list[Any]:
    return tree.xpath(f"//*[@class='{kind}']")


def title(element: Any) -> dict[str, str]:
    """An element's hOCR properties: ``bbox 1 2 3 4; x_wconf 96`` as ``{"bbox": "1 2 3 4"}``..."""
    parts = (part.strip().split(" ", 1) for part in (element.get("title") or "").split(";"))
    return {part[0]: part[1] if len(part) > 1 else "" for part in parts if part[0]}


def test_tesseract_words_their_boxes_and_confidences() -> None:
    blocks = tesseract_blocks()
    tree = made(outcome(blocks))
    (page,) = classed(tree, "ocr_page")
    assert title(page) == {
        "bbox": f"0 0 {SIZE[0]} {SIZE[1]}",
        "ppageno": "0",
        "scan_res": f"{DPI} {DPI}",
    }
    lines = classed(tree, "ocr_line")
    assert [re.sub(r"\s+", " ", line.text_content()).strip() for line in lines] == LINES
    assert all(re.fullmatch(r"\d+ \d+ \d+ \d+", title(line)["bbox"]) for line in lines)
    found = classed(tree, "ocrx_word")
    assert [word.text for word in found] == [word["text"] for word in words(blocks)]
    for element, word in zip(found, words(blocks), strict=True):
        assert title(element) == {
            "bbox": " ".join(map(str, word["bbox"])),
            "x_wconf": str(round(word["conf"])),
        }
    assert classed(tree, "ocr_carea") and classed(tree, "ocr_par")
    system = tree.xpath("//meta[@name='ocr-system']")[0].get("content")
    assert system.startswith("ocrwatch ") and system.endswith("(tesseract)")


def test_a_turned_page_has_its_text_angle() -> None:
    turned = orientation.Orientation(rotation=270, decided_by="osd")
    tree = made(outcome(tesseract_blocks(), turned=turned))
    assert title(classed(tree, "ocr_page")[0])["bbox"] == f"0 0 {SIZE[1]} {SIZE[0]}"
    assert {title(line)["textangle"] for line in classed(tree, "ocr_line")} == {"270"}


def test_deepseek_blocks_placed_their_lines_and_words_not() -> None:
    page = deepseek_outcome()
    tree = made(page, engine={"name": "vllm"})
    found = page.result.recognition.blocks
    areas = classed(tree, "ocr_carea")
    texts = [block for block in found if block["type"] != "image"]
    assert [title(area)["bbox"] for area in areas] == [" ".join(map(str, b["bbox"])) for b in texts]
    (photo,) = classed(tree, "ocr_photo")
    assert title(photo)["bbox"] == " ".join(map(str, found[2]["bbox"]))
    lines = classed(tree, "ocr_line")
    assert len(lines) == 5 and not any(line.get("title") for line in lines)
    assert not any(word.get("title") for word in classed(tree, "ocrx_word"))
    assert [word.text for word in classed(tree, "ocrx_word")][:4] == [
        "Watching",
        "Folders",
        "&",
        "Documents",
    ]


def test_a_failed_page_is_an_empty_page() -> None:
    tree = made(outcome([], status="failed"), outcome([], index=1, dpi_from="assumed"))
    pages = classed(tree, "ocr_page")
    assert [title(page)["ppageno"] for page in pages] == ["0", "1"]
    assert "scan_res" not in title(pages[1]) and not classed(tree, "ocr_line")


def test_a_skewed_page_has_its_baseline_slope() -> None:
    """A skew is a line's ``baseline`` slope, as Tesseract writes it, a quarter turn its
    ``textangle``: text 2 degrees clockwise of its quarter turn falls along it (slope > 0)."""
    skewed = orientation.Orientation(rotation=90, deskew=-2.0, decided_by="osd")
    for line in classed(made(outcome(tesseract_blocks(), turned=skewed)), "ocr_line"):
        assert title(line)["textangle"] == "90"
        assert re.fullmatch(r"0\.035 -\d+", title(line)["baseline"])


# How each page stands, and whether OCRmyPDF keeps its words within their lines' boxes: a line that
# rises to the right it sizes by its box's height, from our hOCR as from Tesseract's own, and its
# words overrun the box by up to 9 pt (their centres stay on the line).
CROSS = {
    "upright": (orientation.AS_RENDERED, True),
    "turned": (orientation.Orientation(rotation=270, decided_by="osd"), True),
    "upside down": (orientation.Orientation(rotation=180, decided_by="osd"), True),
    "skewed": (orientation.Orientation(deskew=-2.0), True),
    "turned and skewed": (
        orientation.Orientation(rotation=90, deskew=-2.0, decided_by="osd"),
        True,
    ),
    "rising": (orientation.Orientation(deskew=2.0), False),
}
NEAR_PT = 2.0  # how far OCRmyPDF's text may land from where the hOCR puts it, in points


@pytest.mark.parametrize(("turned", "fits"), list(CROSS.values()), ids=list(CROSS))
def test_ocrmypdf_reads_our_hocr_as_we_wrote_it(turned: Any, fits: bool, tmp_path: Path) -> None:
    """OCRmyPDF's own hOCR reader and text-layer renderer (what ``ocrmypdf`` grafts onto a page)
    make from our file a PDF whose words are ocrwatch's Markdown in its order, each where our hOCR
    put it: along its line within 2 pt of its box, across it within its line's box, each letter
    drawn at the angle the text stands at."""
    markdown, blocks = tesseract_read()
    (page,) = positions.pages([outcome(blocks, turned=turned)])
    pdf = ocrmypdf_text_layer(hocr.document([page], "report.pdf", ENGINE), tmp_path)
    assert pypdf.PdfReader(pdf).pages[0].extract_text().split() == markdown.split()
    angles = {math.degrees(math.atan2(c.matrix[1], c.matrix[0])) for c in characters(pdf)}
    assert angles and all(abs((a - page.rotation + 180) % 360 - 180) < 0.1 for a in angles), angles
    found = subprocess.run(
        ["pdftotext", "-bbox", pdf, "-"], capture_output=True, text=True, check=True
    ).stdout
    placed: dict[str, list[tuple[float, ...]]] = {}
    for *box, text in re.findall(
        r'<word xMin="(\S+)" yMin="(\S+)" xMax="(\S+)" yMax="(\S+)">([^<]*)<', found
    ):
        placed.setdefault(html.unescape(text), []).append(tuple(map(float, box)))
    along = 0 if round(page.rotation / 90) % 2 == 0 else 1  # the page's axis its lines run along
    across = 1 - along
    for line in (line for block in page.blocks for line in block.lines):
        row = points(line.box)
        for word in line.words:
            got, want = placed[word.text].pop(0), points(word.box)
            assert got[along] == pytest.approx(want[along], abs=NEAR_PT), word
            assert got[along + 2] == pytest.approx(want[along + 2], abs=NEAR_PT), word
            assert row[across] < (got[across] + got[across + 2]) / 2 < row[across + 2], word
            if fits:
                low, high = row[across] - NEAR_PT, row[across + 2] + NEAR_PT
                assert low <= got[across] < got[across + 2] <= high, word


def characters(pdf: Path) -> list[Any]:
    """Every letter pdfminer (OCRmyPDF's) finds in the PDF, each with its text matrix."""
    from pdfminer.high_level import extract_pages
    from pdfminer.layout import LTChar

    def within(item: Any) -> list[Any]:
        if isinstance(item, LTChar):
            return [item]
        return [c for child in item for c in within(child)] if hasattr(item, "__iter__") else []

    return [c for page in extract_pages(pdf) for c in within(page)]


def points(box: Any) -> tuple[float, ...]:
    """A box in pixels at ``DPI`` as points, the PDF's unit."""
    return tuple(value * 72 / DPI for value in box)


def ocrmypdf_text_layer(data: bytes, tmp_path: Path) -> Path:
    """The text-layer PDF that OCRmyPDF renders from the hOCR file ``data`` as its pipeline does:
    ``HocrParser``, then ``Fpdf2MultiPageRenderer`` with its fonts at the hOCR's ``scan_res``."""
    reason = (
        "OCRmyPDF is not installed (pip install -e '.[test]'): its hOCR reader cross-checks ours"
    )
    ocrmypdf = pytest.importorskip("ocrmypdf", reason=reason)
    from ocrmypdf.font import MultiFontManager
    from ocrmypdf.fpdf_renderer import Fpdf2MultiPageRenderer
    from ocrmypdf.hocrtransform import HocrParser

    source = tmp_path / "report.hocr"
    source.write_bytes(data)
    tree = HocrParser(source).parse()
    assert tree.dpi == DPI
    fonts = MultiFontManager(Path(ocrmypdf.__file__).parent / "data")
    pdf = tmp_path / "layer.pdf"
    Fpdf2MultiPageRenderer([(0, tree, tree.dpi)], fonts).render(pdf)
    return pdf
