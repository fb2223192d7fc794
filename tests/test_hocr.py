"""NAME.hocr: every file parses (as XHTML and as HTML), with Tesseract's classes and ``bbox``
titles: words, their boxes and confidences from a page Tesseract reads now; DeepSeek-OCR's block
boxes, its lines and words without one; a turned page's ``textangle``; ``scan_res`` where the DPI is
known."""

from __future__ import annotations

import re
from typing import Any

import lxml.html
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
