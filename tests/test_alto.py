"""NAME.alto.xml: every file valid against the official ALTO 4.4 schema, from a page Tesseract reads
now (words, boxes, confidences) and from DeepSeek-OCR's grounding (block boxes only), on the page
as rendered: a turned page's boxes mapped back and its rotation said."""

from __future__ import annotations

from typing import Any

from lxml import etree

from ocrwatch.pages import orientation
from ocrwatch.plaintext import PlainText
from ocrwatch.results import alto, positions
from tests.support.layout_pages import (
    DPI,
    LINES,
    SIZE,
    alto_schema,
    deepseek_outcome,
    outcome,
    tesseract_blocks,
    words,
)

NS = {"a": alto.NAMESPACE}
ENGINE = {"name": "tesseract", "version": "5.3.0", "lang": "eng"}


def made(*outcomes: Any, engine: dict[str, Any] = ENGINE) -> Any:
    """The ALTO file of these pages, parsed, once the schema has found it valid."""
    data = alto.document(positions.pages(outcomes), "report.pdf", engine, "2026-12-07T19:00:00Z")
    tree = etree.fromstring(data)
    alto_schema().assertValid(tree)
    return tree


def box(element: Any) -> tuple[int, ...]:
    left, top = int(element.get("HPOS")), int(element.get("VPOS"))
    return left, top, left + int(element.get("WIDTH")), top + int(element.get("HEIGHT"))


def test_tesseract_words_their_boxes_and_confidences() -> None:
    blocks = tesseract_blocks()
    tree = made(outcome(blocks))
    page = tree.find("a:Layout/a:Page", NS)
    assert (page.get("WIDTH"), page.get("HEIGHT")) == tuple(map(str, SIZE))
    assert "ROTATION" not in page.attrib and 0 < float(page.get("PC")) <= 1
    strings = tree.findall(".//a:String", NS)
    assert [s.get("CONTENT") for s in strings] == [w["text"] for w in words(blocks)]
    assert " ".join(s.get("CONTENT") for s in strings) == " ".join(LINES)
    for string, word in zip(strings, words(blocks), strict=True):
        assert box(string) == tuple(word["bbox"])
        assert float(string.get("WC")) == round(word["conf"] / 100, 3)
    assert len(tree.findall(".//a:TextLine", NS)) == len(LINES)
    assert all(line.get("HPOS") for line in tree.findall(".//a:TextLine", NS))
    assert len(tree.findall(".//a:SP", NS)) == len(strings) - len(LINES)
    settings = tree.find(".//a:Processing/a:processingStepSettings", NS).text
    width_mm, height_mm = (round(side / DPI * 25.4, 1) for side in SIZE)
    assert settings == f"{SIZE[0]} x {SIZE[1]} px; {DPI} dpi; {width_mm:g} x {height_mm:g} mm"
    said = tree.find(".//a:Processing/a:processingStepDescription", NS).text
    assert said == "page 1 read by tesseract 5.3.0 (eng)"
    assert page.get("PROCESSING") == tree.find(".//a:Processing", NS).get("ID")


def test_a_turned_page_is_described_as_rendered() -> None:
    """A page turned 90 degrees clockwise to be read: its boxes on the rendered page (width and
    height swapped), its text said to stand 90 degrees counter-clockwise there."""
    blocks = tesseract_blocks()
    turned = orientation.Orientation(rotation=90, decided_by="osd")
    tree = made(outcome(blocks, turned=turned))
    page = tree.find("a:Layout/a:Page", NS)
    assert (page.get("WIDTH"), page.get("HEIGHT"), page.get("ROTATION")) == (
        str(SIZE[1]),
        str(SIZE[0]),
        "90",
    )
    first = words(blocks)[0]["bbox"]
    # Turned back counter-clockwise: an upright pixel (u, v) was at (v, W - u) on the rendered page.
    expected = (first[1], SIZE[0] - first[2], first[3], SIZE[0] - first[0])
    assert box(tree.find(".//a:String", NS)) == expected
    assert "90 degrees counter-clockwise" in tree.find(".//a:processingStepSettings", NS).text


def test_deepseek_blocks_placed_their_lines_and_words_not() -> None:
    page = deepseek_outcome()
    tree = made(page, engine={"name": "vllm", "model": "deepseek-ai/DeepSeek-OCR-2"})
    found = page.result.recognition.blocks
    blocks = [block for block in found if block["type"] != "image"]
    text_blocks = tree.findall(".//a:TextBlock", NS)
    assert [box(element) for element in text_blocks] == [tuple(b["bbox"]) for b in blocks]
    lines = tree.findall(".//a:TextLine", NS)
    assert not any(line.get("HPOS") for line in lines)
    assert not any(s.get("HPOS") or s.get("WC") for s in tree.findall(".//a:String", NS))
    contents = [" ".join(s.get("CONTENT") for s in line.findall("a:String", NS)) for line in lines]
    assert contents == [
        "Watching Folders & Documents",
        "We describe a daemon.",
        "It renders pages.",
        "name value",
        "x 1",
    ]
    illustration = tree.find(".//a:Illustration", NS)
    figure = next(block for block in found if block["type"] == "image")
    assert illustration.get("TYPE") == "image" and box(illustration) == tuple(figure["bbox"])
    tags = {t.get("LABEL"): t.get("ID") for t in tree.findall("a:Tags/a:LayoutTag", NS)}
    assert set(tags) == {"title", "image", "table"}
    assert text_blocks[0].get("TAGREFS") == tags["title"] and "TAGREFS" not in text_blocks[1].attrib
    assert "PC" not in tree.find("a:Layout/a:Page", NS).attrib
    said = tree.find(".//a:processingStepDescription", NS).text
    assert said == "page 1 read by vllm deepseek-ai/DeepSeek-OCR-2"


def test_pages_failed_taken_from_their_layer_or_unsized_stay_valid() -> None:
    """A failed page has no text; a page taken from its own text layer has text and no box; a
    page whose DPI was assumed has no size in millimetres; control characters become U+FFFD."""
    failed = outcome([], status="failed", index=0)
    layer = outcome(
        [], markdown="Own text\x07 layer\n# kept", plain=PlainText(), index=1, dpi_from="assumed"
    )
    tree = made(failed, layer, deepseek_outcome(index=2))
    pages = tree.findall("a:Layout/a:Page", NS)
    assert [page.get("PHYSICAL_IMG_NR") for page in pages] == ["1", "2", "3"]
    assert not pages[0].findall(".//a:String", NS)
    lines = pages[1].findall(".//a:TextLine", NS)
    assert [[s.get("CONTENT") for s in line.findall("a:String", NS)] for line in lines] == [
        ["Own", "text\ufffd", "layer"],
        ["#", "kept"],
    ]
    settings = [step.text for step in tree.findall(".//a:processingStepSettings", NS)]
    assert settings[1] == f"{SIZE[0]} x {SIZE[1]} px"
    said = tree.findall(".//a:processingStepDescription", NS)
    assert said[0].text == "not read"


def test_a_deskewed_page_says_its_angle_and_each_box_holds_its_word() -> None:
    """Levelled by 2 degrees clockwise to be read: on the page as rendered each box is the upright
    rectangle around the word's turned one, the text said to stand 2 degrees counter-clockwise."""
    blocks = tesseract_blocks()
    tree = made(outcome(blocks, turned=orientation.Orientation(deskew=2.0)))
    assert tree.find("a:Layout/a:Page", NS).get("ROTATION") == "2"
    for string, word in zip(tree.findall(".//a:String", NS), words(blocks), strict=True):
        left, top, right, bottom = box(string)
        upright = word["bbox"]
        assert right - left >= upright[2] - upright[0] and bottom - top >= upright[3] - upright[1]
        assert 0 <= left < right <= SIZE[0] and 0 <= top < bottom <= SIZE[1]
