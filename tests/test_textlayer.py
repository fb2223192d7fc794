"""textlayer: searchable PDFs from real Tesseract output, checked with the real pdftotext, qpdf and
PDFium.

Pages are made here (tests/support/docs.py, or pikepdf for page geometry docs.py does not write),
rendered
by the renderer, read by the Tesseract engine, then the text layer is built and read back: text
(similarity to the engine's Markdown), word positions (``pdftotext -bbox``), the file's structure
(``qpdf --check``), and the original page content, which must come through byte for byte.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import subprocess
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pikepdf
import pypdfium2 as pdfium
import pytest
from PIL import Image, ImageChops, ImageStat
from rapidfuzz import fuzz

from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek.grounding import parse
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import CorruptImage, CorruptPdf
from ocrwatch.infra.memory import DecodeBudget, image_bytes
from ocrwatch.pages import deskew, orientation, render
from ocrwatch.pages.render import BAND_BYTES
from ocrwatch.results import pdfimage, textlayer
from ocrwatch.results.textlayer import LayerLine, LayerWord, PageText
from tests.support import docs
from tests.support.hostile_pdfs import MiB, write_form_bomb, write_nested_forms
from tests.test_grounding import PAPER, WORKSHEET

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("tesseract", "pdftoppm", "pdftotext", "qpdf")),
    reason="needs tesseract, poppler-utils and qpdf",
)

PAGE_ONE = [
    "Invoice 4711 was paid",
    "on the twelfth of March.",
    "",
    "Total amount 17.50 EUR",
    "Thank you kindly",
]
PAGE_TWO = ["Second page of the letter", "with two lines of text"]
TOLERANCE_PT = 1.5
RENDER = RenderConfig()  # frozen: one default shared by the helpers
SHA = "ab" * 32  # the sha256 of the source, as the mark records it


# --- helpers --------------------------------------------------------------------------------------


def ocr(
    path: Path, render_cfg: RenderConfig = RENDER
) -> list[tuple[render.RenderedPage, Recognition]]:
    """Every page rendered as the daemon renders it for Tesseract, and Tesseract's reading of it."""
    info = render.probe(path, render.Limits.from_config(LimitsConfig()))

    async def main() -> list[tuple[render.RenderedPage, Recognition]]:
        engine = TesseractEngine(TesseractConfig(workers=1))
        await engine.start()
        spec = render.render_spec(render_cfg, engine.geometry)
        done = []
        for index in range(info.pages):
            page = await asyncio.to_thread(render.render_page, path, info, index, spec)
            done.append(
                (page, await engine.recognize(PageRequest(f"page-{index}", page.image, prompt="")))
            )
        await engine.close()
        return done

    return asyncio.run(main())


def texts(pages: Sequence[tuple[render.RenderedPage, Recognition]]) -> list[PageText | None]:
    return [
        textlayer.page_text(page.width, page.height, recognition.blocks, page.orientation)
        for page, recognition in pages
    ]


def pdftotext(path: Path, *args: str) -> str:
    return subprocess.run(
        ["pdftotext", *args, str(path), "-"], capture_output=True, text=True, check=True
    ).stdout


def page_texts(path: Path) -> list[str]:
    return pdftotext(path).split("\f")[:-1]


def bbox_words(path: Path) -> list[list[tuple[str, tuple[float, float, float, float]]]]:
    """Each page's words with their boxes in points, top-left origin of the page as displayed
    (CropBox)."""
    root = ElementTree.fromstring(pdftotext(path, "-bbox", "-cropbox"))
    pages = []
    for page in root.iter("{http://www.w3.org/1999/xhtml}page"):
        pages.append(
            [
                (
                    word.text or "",
                    tuple(float(word.get(key)) for key in ("xMin", "yMin", "xMax", "yMax")),
                )
                for word in page.iter("{http://www.w3.org/1999/xhtml}word")
            ]
        )
    return pages  # type: ignore[return-value]


def similarity(got: str, want: str) -> float:
    return fuzz.ratio(" ".join(got.split()), " ".join(want.split())) / 100


def qpdf_check(path: Path) -> None:
    done = subprocess.run(["qpdf", "--check", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and "No syntax or stream encoding errors" in done.stdout, (
        done.stdout + done.stderr
    )


def pdfium_texts(path: Path) -> list[str]:
    document = pdfium.PdfDocument(str(path))
    try:
        return [document[index].get_textpage().get_text_range() for index in range(len(document))]
    finally:
        document.close()


def assert_words_placed(
    path: Path, pages: Sequence[tuple[render.RenderedPage, Recognition]]
) -> None:
    """Every word Tesseract found is where pdftotext finds it: its pixel box at the page's scale."""
    for (page, recognition), found in zip(pages, bbox_words(path), strict=True):
        scale = 72 / page.dpi
        wanted = [word for block in recognition.blocks for word in block["words"]]
        assert [text for text, _ in found] == [word["text"] for word in wanted]
        for word, (_, box) in zip(wanted, found, strict=True):
            left, _, right, _ = (value * scale for value in word["bbox"])
            assert abs(box[0] - left) < TOLERANCE_PT and abs(box[2] - right) < TOLERANCE_PT, (
                word,
                box,
            )
        # a line's words share its box: top and bottom within the line's
        for block in recognition.blocks:
            top, bottom = block["bbox"][1] * scale, block["bbox"][3] * scale
            box = next(box for text, box in found if text == block["words"][0]["text"])
            assert abs(box[1] - top) < TOLERANCE_PT and abs(box[3] - bottom) < TOLERANCE_PT, (
                block,
                box,
            )


def content_streams(page: pikepdf.Page) -> list[pikepdf.Object]:
    contents = page.obj.get("/Contents")
    if contents is None:
        return []
    return list(contents) if isinstance(contents, pikepdf.Array) else [contents]


def page_pdf(
    path: Path,
    image: Image.Image,
    *,
    rotate: int = 0,
    origin: tuple[float, float] = (0.0, 0.0),
    margin: float = 0.0,
    dpi: float = 150,
) -> Path:
    """One page showing ``image`` upright at ``dpi`` whatever its /Rotate: the image is drawn turned
    the other way in user space. The CropBox starts at ``origin``; the MediaBox reaches ``margin``
    beyond it."""
    shown_w, shown_h = image.width * 72 / dpi, image.height * 72 / dpi
    width, height = (shown_h, shown_w) if rotate in (90, 270) else (shown_w, shown_h)
    x0, y0 = origin
    x1, y1 = x0 + width, y0 + height
    placement = {
        0: (shown_w, 0, 0, shown_h, x0, y0),
        90: (0, shown_w, -shown_h, 0, x1, y0),
        180: (-shown_w, 0, 0, -shown_h, x1, y1),
        270: (0, -shown_w, shown_h, 0, x0, y1),
    }[rotate]
    with pikepdf.new() as pdf:
        page = pdf.add_blank_page(page_size=(width, height))
        page.obj.MediaBox = [x0 - margin, y0 - margin, x1 + margin, y1 + margin]
        page.obj.CropBox = [x0, y0, x1, y1]
        page.obj.Rotate = rotate
        grey = image.convert("L")
        picture = pdf.make_stream(
            zlib.compress(grey.tobytes()),
            Type=pikepdf.Name.XObject,
            Subtype=pikepdf.Name.Image,
            Width=grey.width,
            Height=grey.height,
            ColorSpace=pikepdf.Name.DeviceGray,
            BitsPerComponent=8,
            Filter=pikepdf.Name.FlateDecode,
        )
        page.obj.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(Im0=picture))
        page.obj.Contents = pdf.make_stream(
            b"q %.4f %.4f %.4f %.4f %.4f %.4f cm /Im0 Do Q\n" % placement
        )
        pdf.save(path)
    return path


# --- PDF sources ----------------------------------------------------------------------------------


def test_pdf_gets_the_text_in_reading_order_and_keeps_its_pages(tmp_path: Path) -> None:
    source = docs.write_pdf(tmp_path / "letter.pdf", [PAGE_ONE, PAGE_TWO])
    pages = ocr(source)
    out = tmp_path / "letter.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", texts(pages), out, SHA)

    qpdf_check(out)
    extracted = page_texts(out)
    assert len(extracted) == 2
    for (_, recognition), text in zip(pages, extracted, strict=True):
        assert similarity(text, recognition.markdown) >= 0.9, (text, recognition.markdown)
    assert "Invoice 4711 was paid" in extracted[0] and extracted[0].index("Invoice") < extracted[
        0
    ].index("Thank")
    assert_words_placed(out, pages)
    for (_, recognition), text in zip(pages, pdfium_texts(out), strict=True):
        assert similarity(text, recognition.markdown) >= 0.9, text

    with pikepdf.open(source) as before, pikepdf.open(out) as after:
        for old, new in zip(before.pages, after.pages, strict=True):
            kept, added = content_streams(new)[1:], content_streams(new)[0]
            assert [s.read_raw_bytes() for s in kept] == [
                s.read_raw_bytes() for s in content_streams(old)
            ]
            assert [dict(s.stream_dict) for s in kept] == [
                dict(s.stream_dict) for s in content_streams(old)
            ]
            drawn = [str(operator) for _, operator in pikepdf.parse_content_stream(added)]
            assert drawn == ["q", "Do", "Q"]  # the new stream only draws the layer
            assert (
                new.mediabox == old.mediabox
                and new.obj.Resources.XObject.Im0.read_raw_bytes()
                == (old.obj.Resources.XObject.Im0.read_raw_bytes())
            )


def test_a_page_with_text_of_its_own_keeps_it_and_gets_no_second_layer(tmp_path: Path) -> None:
    """OCRmyPDF's ``--skip-text``: pdftotext reads each line of a born-digital page once; a scanned
    page beside it gets the engine's text. The file is marked as ocrwatch's; its source is not."""
    born = docs.write_pdf(tmp_path / "born.pdf", [PAGE_ONE], text_layer=True)
    scan = docs.write_pdf(tmp_path / "scan.pdf", [PAGE_TWO])
    source = tmp_path / "mixed.pdf"
    with pikepdf.open(born) as pdf, pikepdf.open(scan) as other:
        pdf.pages.extend(other.pages)
        pdf.save(source)
    out = tmp_path / "mixed.pdf.ocr.pdf"
    layers = textlayer.searchable_pdf(source, "pdf", texts(ocr(source)), out, SHA)
    assert layers.pages == ["own", "ocr"]

    qpdf_check(out)
    first, second = page_texts(out)
    for line in filter(None, PAGE_ONE):
        assert first.count(line) == 1, first
    assert similarity(second, " ".join(PAGE_TWO)) >= 0.9
    with open(out, "rb") as made, open(source, "rb") as original:
        assert textlayer.is_ours(made) and not textlayer.is_ours(original)
    with pikepdf.open(out) as pdf:
        assert str(pdf.docinfo["/OcrwatchSource"]) == f"ocrwatch/1 sha256:{SHA}"


def test_a_failed_page_keeps_its_page_and_gets_no_text(tmp_path: Path) -> None:
    source = docs.write_pdf(tmp_path / "two.pdf", [PAGE_ONE, PAGE_TWO])
    first, second = texts(ocr(source))
    out = tmp_path / "two.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", [None, second], out, SHA)

    qpdf_check(out)
    extracted = page_texts(out)
    assert extracted[0].strip() == "" and "Second page" in extracted[1]
    with pikepdf.open(source) as before, pikepdf.open(out) as after:
        assert len(after.pages) == 2
        assert [s.read_raw_bytes() for s in content_streams(after.pages[0])] == [
            s.read_raw_bytes() for s in content_streams(before.pages[0])
        ]
        assert "/OcrText" not in after.pages[0].obj.Resources.XObject
    assert first is not None and first.lines


@pytest.mark.parametrize("rotate", [90, 0, 180, 270])
def test_rotated_page_with_offset_boxes_places_words_where_they_are_shown(
    tmp_path: Path, rotate: int
) -> None:
    """/Rotate and a CropBox inside a MediaBox whose origin is far from (0, 0): words land on their
    pixels."""
    image = docs.text_image(["Rotated page of text", "with a second line"], size=(1100, 700))
    source = page_pdf(
        tmp_path / "rotated.pdf", image, rotate=rotate, origin=(137.0, -250.0), margin=40.0
    )
    pages = ocr(source)
    assert similarity(pages[0][1].markdown, "Rotated page of text with a second line") >= 0.9
    out = tmp_path / "rotated.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", texts(pages), out, SHA)

    qpdf_check(out)
    assert similarity(page_texts(out)[0], pages[0][1].markdown) >= 0.9
    assert_words_placed(out, pages)
    with pikepdf.open(out) as pdf:
        assert pdf.pages[0].rotation == rotate  # the page is shown as before


@pytest.mark.parametrize(
    ("turn", "rotate", "lean"), [(90, 0, 0.0), (270, 90, 0.0), (180, 0, 0.0), (0, 0, 2.0)]
)
def test_a_page_read_upright_gets_its_text_over_its_glyphs_as_shown(
    tmp_path: Path, turn: int, rotate: int, lean: float
) -> None:
    """A page scanned turned (its picture turned ``turn`` degrees clockwise, or leaning ``lean``
    degrees and levelled by ``deskew``, shown so under /Rotate ``rotate``) is read upright, and its
    words land on their glyphs as the page is shown: each word's box, mapped back through
    ``orientation.to_shown``, is where pdftotext finds it. The page keeps its /Rotate."""
    lines = ["Turned page of text", "read upright by ocrwatch", "and placed back as shown"]
    lines.append("on the sheet")
    image = orientation.turn(docs.text_image(lines, size=(1240, 900)), turn)
    image = deskew.straighten(image, lean) if lean else image
    source = page_pdf(tmp_path / "turned.pdf", image, rotate=rotate)
    pages = ocr(source, RenderConfig(deskew=bool(lean)))
    page, recognition = pages[0]
    assert page.orientation.rotation == (360 - turn) % 360
    assert page.orientation.deskew == (pytest.approx(-lean, abs=0.15) if lean else None)
    assert similarity(recognition.markdown, " ".join(lines)) >= 0.9
    out = tmp_path / "turned.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", texts(pages), out, SHA)

    qpdf_check(out)
    # pdftotext orders lines running upwards from the last: the words are the layer's, not the order
    assert sorted(page_texts(out)[0].split()) == sorted(recognition.markdown.split())
    a, b, c, d, e, f = orientation.to_shown(page.orientation, page.width, page.height)
    scale = 72 / page.dpi
    found = dict(bbox_words(out)[0])
    for block in recognition.blocks:
        for word in block["words"]:
            left, _, right, _ = word["bbox"]
            top, bottom = block["bbox"][1], block["bbox"][3]  # the font is the line's height
            corners = [
                (a * u + c * v + e, b * u + d * v + f) for u in (left, right) for v in (top, bottom)
            ]
            xs, ys = [x * scale for x, _ in corners], [y * scale for _, y in corners]
            box = found[word["text"]]
            expected = (min(xs), min(ys), max(xs), max(ys))
            close = all(
                abs(got - want) < TOLERANCE_PT for got, want in zip(box, expected, strict=True)
            )
            assert close, (word, box, expected)
    with pikepdf.open(out) as pdf:
        assert pdf.pages[0].rotation == rotate


def test_pages_sharing_their_resources_each_get_their_own_text(tmp_path: Path) -> None:
    """One /Resources dictionary inherited by every page from the page tree, another shared by
    reference."""
    source = docs.write_pdf(
        tmp_path / "shared.pdf", [["Alpha page"], ["Bravo page"], ["Charlie page"]]
    )
    with pikepdf.open(source) as pdf:
        images = {f"/Im{n}": page.obj.Resources.XObject.Im0 for n, page in enumerate(pdf.pages)}
        shared = pdf.make_indirect(pikepdf.Dictionary(XObject=pikepdf.Dictionary(images)))
        for number, page in enumerate(pdf.pages):
            page.obj.Contents = pdf.make_stream(
                page.obj.Contents.read_bytes().replace(b"/Im0", b"/Im%d" % number)
            )
            page.obj.Resources = shared
        pdf.Root.Pages.Resources = shared
        del pdf.pages[2].obj["/Resources"]  # this one inherits from the page tree
        pdf.save(tmp_path / "shared-resources.pdf")
    source = tmp_path / "shared-resources.pdf"
    assert pdftotext(source).strip() == ""
    pages = texts(ocr(source))
    out = tmp_path / "shared.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", pages, out, SHA)

    qpdf_check(out)
    extracted = [" ".join(text.split()) for text in page_texts(out)]
    assert extracted == ["Alpha page", "Bravo page", "Charlie page"]
    with pikepdf.open(out) as pdf:  # each page names its own layer, none of the other pages' layers
        for page in pdf.pages:
            assert sorted(page.obj.Resources.XObject.keys()) == ["/Im0", "/Im1", "/Im2", "/OcrText"]


def test_encrypted_pdf_that_opens_without_a_password_stays_encrypted(tmp_path: Path) -> None:
    source = docs.write_encrypted_pdf(
        tmp_path / "open.pdf", user_password="", pages=[["Locked but open"]]
    )
    out = tmp_path / "open.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", texts(ocr(source)), out, SHA)

    qpdf_check(out)
    assert "Locked but open" in pdftotext(out)
    with pikepdf.open(out) as pdf:
        assert pdf.is_encrypted


def test_non_latin_text_is_extracted_as_written(tmp_path: Path) -> None:
    """The glyphless font maps UTF-16 codes to themselves: Greek, Cyrillic, CJK and accents come
    back."""
    words = ["Grüße", "Ελληνικά", "Привет", "日本語の文書", "naïve", "ﬁnal"]
    lines = tuple(
        LayerLine(
            (100, 100 + 80 * n, 900, 150 + 80 * n),
            (LayerWord(word, (100, 100 + 80 * n, 400, 150 + 80 * n)),),
        )
        for n, word in enumerate(words)
    )
    source = docs.write_pdf(tmp_path / "blank.pdf", [Image.new("L", docs.A4_150DPI, 255)])
    out = tmp_path / "blank.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", [PageText(*docs.A4_150DPI, lines)], out, SHA)

    expected = [*words[:-1], "final"]  # NFKC splits the ligature, so a search for "final" finds it
    assert pdftotext(out).split() == expected
    assert pdfium_texts(out)[0].split() == expected


def test_deepseek_blocks_spread_their_lines_over_their_boxes(tmp_path: Path) -> None:
    """Recorded grounding output: each block's lines evenly down its box, figures without text."""
    width, height = docs.A4_150DPI
    blocks = parse(PAPER, width, height).blocks
    text = textlayer.page_text(width, height, blocks)
    source = docs.write_pdf(tmp_path / "paper.pdf", [Image.new("L", docs.A4_150DPI, 255)])
    out = tmp_path / "paper.pdf.ocr.pdf"
    textlayer.searchable_pdf(source, "pdf", [text], out, SHA)

    qpdf_check(out)
    extracted = [" ".join(line.split()) for line in pdftotext(out).splitlines() if line.strip()]
    # the heading mark is not text
    assert extracted[0] == "Watching Folders for Documents: A Field Report"
    # a table row per line
    assert extracted[-4:] == ["Engine Pages/s", "vLLM 5.4", "Tesseract 0.8", "1"]
    scale = 72 / 150
    table = next(block["bbox"] for block in blocks if block["type"] == "table")
    rows = [box for word, box in bbox_words(out)[0] if word in ("Engine", "vLLM", "Tesseract")]
    third = (table[3] - table[1]) / 3 * scale
    for number, box in enumerate(rows):
        assert abs(box[0] - table[0] * scale) < TOLERANCE_PT
        assert abs(box[1] - (table[1] * scale + number * third)) < TOLERANCE_PT
        assert abs(box[3] - (table[1] * scale + (number + 1) * third)) < TOLERANCE_PT
    assert not any(word.startswith("page-") for word in pdftotext(out).split())


def test_page_text_spreads_a_block_over_several_boxes_in_order() -> None:
    block = {
        "type": "text",
        "text": "one\ntwo\nthree\nfour",
        "bbox": [0, 0, 200, 100],
        "boxes": [[0, 0, 90, 100], [110, 0, 200, 100]],
    }
    lines = textlayer.page_text(200, 100, [block]).lines
    assert [line.words[0].text for line in lines] == ["one", "two", "three", "four"]
    assert [line.box for line in lines] == [
        (0, 0, 90, 50),
        (0, 50, 90, 100),
        (110, 0, 200, 50),
        (110, 50, 200, 100),
    ]
    worksheet = textlayer.page_text(1000, 1000, parse(WORKSHEET, 1000, 1000).blocks).lines
    assert all(line.words[0].text.strip() for line in worksheet) and not any(
        "figure" in str(l) for l in worksheet
    )
    no_box = textlayer.page_text(
        300, 600, [{"type": "text", "text": "free\nocr", "bbox": None}]
    ).lines
    assert [line.box for line in no_box] == [(0, 0, 300, 300), (0, 300, 300, 600)]


# --- image sources --------------------------------------------------------------------------------


def test_png_becomes_a_page_at_its_dpi_with_its_text(tmp_path: Path) -> None:
    source = docs.write_png(tmp_path / "scan.png", PAGE_ONE, dpi=200)
    pages = ocr(source)
    out = tmp_path / "scan.png.ocr.pdf"
    textlayer.searchable_pdf(source, "image", texts(pages), out, SHA)

    qpdf_check(out)
    with pikepdf.open(out) as pdf:
        assert [float(v) for v in pdf.pages[0].mediabox] == pytest.approx(
            [0, 0, 1240 * 72 / 200, 1754 * 72 / 200]
        )
        (image,) = pdf.pages[0].get_images().values()
        # lossless
        assert pikepdf.PdfImage(image).as_pil_image().tobytes() == Image.open(source).tobytes()
    assert similarity(page_texts(out)[0], pages[0][1].markdown) >= 0.9
    assert_words_placed(out, pages)


@pytest.mark.parametrize("orientation", [6, 3, 8, 1])
def test_jpeg_keeps_its_bytes_and_its_orientation(tmp_path: Path, orientation: int) -> None:
    source = docs.write_jpeg(tmp_path / "photo.jpg", PAGE_TWO, orientation=orientation)
    pages = ocr(source)
    out = tmp_path / "photo.jpg.ocr.pdf"
    textlayer.searchable_pdf(source, "image", texts(pages), out, SHA)

    qpdf_check(out)
    with pikepdf.open(out) as pdf:
        (image,) = pdf.pages[0].get_images().values()
        assert image.Filter == "/DCTDecode" and image.read_raw_bytes() == source.read_bytes()
    assert similarity(page_texts(out)[0], pages[0][1].markdown) >= 0.9
    assert_words_placed(out, pages)
    # The page looks like the upright image the engine read (PDFium draws it, the renderer made the
    # other).
    document = pdfium.PdfDocument(str(out))
    try:
        shown = document[0].render(scale=150 / 72).to_pil().convert("L")
    finally:
        document.close()
    upright = pages[0][0].image.convert("L")
    assert abs(shown.width - upright.width) <= 1 and abs(shown.height - upright.height) <= 1
    difference = ImageChops.difference(shown.resize(upright.size), upright)
    assert ImageStat.Stat(difference).mean[0] < 8


def test_a_fax_page_is_its_true_size_and_read(tmp_path: Path) -> None:
    """A 204 x 98 dpi fax (Letter) was a 609.9 x 404.5 pt page: now 8.5 x 11 in, whether sized by
    what the renderer recorded or by the file alone, and Tesseract reads its unsquashed text."""
    source = docs.write_fax(tmp_path / "fax.tif", PAGE_ONE)
    pages = ocr(source, RenderConfig(rotate_pages=False))
    page, recognition = pages[0]
    assert (page.dpi, page.source_dpi) == (204.0, (204.0, 98.0))
    assert similarity(recognition.markdown, "\n".join(PAGE_ONE)) >= 0.9
    recorded = (page.width * 72 / page.dpi, page.height * 72 / page.dpi)  # the sidecar's
    for sizes in ([recorded], []):
        out = tmp_path / "fax.tif.ocr.pdf"
        textlayer.searchable_pdf(source, "image", texts(pages), out, SHA, sizes=sizes)
        with pikepdf.open(out) as pdf:
            box = [float(v) for v in pdf.pages[0].mediabox]
        assert box == pytest.approx([0, 0, 1728 * 72 / 204, 1078 * 72 / 98], abs=0.1)
    assert_words_placed(out, pages)


def test_tiff_frames_become_pages_and_a_failed_one_has_no_text(tmp_path: Path) -> None:
    source = docs.write_tiff(tmp_path / "scan.tif", [PAGE_ONE, PAGE_TWO, ["Third frame"]])
    pages = texts(ocr(source))
    out = tmp_path / "scan.tif.ocr.pdf"
    textlayer.searchable_pdf(source, "image", [pages[0], None, pages[2]], out, SHA)

    qpdf_check(out)
    extracted = page_texts(out)
    assert (
        "Invoice" in extracted[0] and extracted[1].strip() == "" and "Third frame" in extracted[2]
    )
    with pikepdf.open(out) as pdf:
        assert len(pdf.pages) == 3 and all(len(page.get_images()) == 1 for page in pdf.pages)


@pytest.mark.parametrize("mode", ["1", "P"])
def test_bilevel_and_palette_images_without_dpi_keep_their_pixels(
    tmp_path: Path, mode: str
) -> None:
    drawn = docs.text_image(["Bilevel scan"], size=(800, 300)).convert("RGB")
    drawn.paste((200, 30, 30), (600, 200, 700, 280))
    picture = (
        drawn.convert("1")
        if mode == "1"
        else drawn.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    )
    source = docs.write_png(tmp_path / "picture.png", picture, dpi=None)
    out = tmp_path / "picture.png.ocr.pdf"
    textlayer.searchable_pdf(source, "image", texts(ocr(source)), out, SHA)

    qpdf_check(out)
    with pikepdf.open(out) as pdf:
        # 96 dpi
        assert [float(v) for v in pdf.pages[0].mediabox] == pytest.approx(
            [0, 0, 800 * 0.75, 300 * 0.75]
        )
        (image,) = pdf.pages[0].get_images().values()
        assert image.BitsPerComponent == (1 if mode == "1" else 8)
        embedded = pikepdf.PdfImage(image).as_pil_image()
        assert embedded.convert("RGB").tobytes() == picture.convert("RGB").tobytes()  # lossless
        if mode == "P":  # one byte a pixel and its palette, not three
            assert image.ColorSpace[0] == "/Indexed" and image.ColorSpace[1] == "/DeviceRGB"
    assert "Bilevel scan" in pdftotext(out)


# --- hostile content ---------------------------------------------------------------------------

WORD = LayerWord("Recognised", (100, 100, 600, 140))
LINE = PageText(1275, 1650, (LayerLine(WORD.box, (WORD,)),))


def test_text_in_a_form_the_page_never_draws_is_not_the_pages_own(tmp_path: Path) -> None:
    """Only what the page draws counts: text in a form its resources list but no Do invokes is no
    text a reader sees, so the page gets the engine's layer (it used to be taken as ``own``)."""
    source = write_form_bomb(tmp_path / "unused.pdf", 1024)
    with pikepdf.open(source, allow_overwriting_input=True) as pdf:
        form = pdf.pages[0].obj.Resources.XObject.Fx
        form.write(b"BT /F1 12 Tf 72 72 Td (Hidden words) Tj ET")
        form.Resources = pdf.pages[0].obj.Resources
        pdf.save(source)
    layers = textlayer.searchable_pdf(source, "pdf", [LINE], tmp_path / "out.pdf", SHA)
    assert layers.pages == ["ocr"] and layers.skipped == []


def test_forms_nested_five_thousand_deep_give_the_page_no_layer_and_say_why(
    tmp_path: Path,
) -> None:
    """Read by recursion they raised RecursionError, an internal_error: now the page keeps its
    content, gets no layer of ours (its own text may lie deeper), and the reason is recorded."""
    source = write_nested_forms(tmp_path / "deep.pdf", 5000)
    out = tmp_path / "deep.pdf.ocr.pdf"
    layers = textlayer.searchable_pdf(source, "pdf", [LINE], out, SHA)
    assert layers.pages == ["none"]
    assert [(skip["page"], skip["reason"]) for skip in layers.skipped] == [(1, "forms_too_deep")]
    qpdf_check(out)


def test_a_page_drawing_more_content_than_its_bound_gets_no_layer_and_says_why(
    tmp_path: Path,
) -> None:
    source = write_form_bomb(tmp_path / "drawn.pdf", 17 * MiB, drawn=True)
    layers = textlayer.searchable_pdf(source, "pdf", [LINE], tmp_path / "out.pdf", SHA)
    assert layers.pages == ["none"]
    assert [(skip["page"], skip["reason"]) for skip in layers.skipped] == [(1, "content_too_large")]


@pytest.mark.parametrize("mode", ["RGBA", "LA", "I;16", "RGB"])
def test_an_image_is_decoded_within_the_budget_and_converted_a_band_at_a_time(
    tmp_path: Path, mode: str
) -> None:
    """The image's pixels are held within the decode budget the renderer shares (they used to be
    decoded outside it, and converted whole: three more copies); converted in bands, the pixels
    are those of the whole image converted."""
    width, height = 1600, 3 * BAND_BYTES // (1600 * 4) + 17  # four bands, the last a short one
    gradient = Image.linear_gradient("L").resize((width, height))
    if mode == "I;16":
        picture = Image.frombytes("I;16", (width, height), bytes(gradient.tobytes()) * 2)
    else:
        bands = [gradient, gradient.rotate(90), gradient, gradient.transpose(0)]
        picture = Image.merge("RGBA", bands).convert(mode)
    source = tmp_path / "picture.png"
    picture.save(source)
    budget = DecodeBudget(1024 * MiB)
    out = tmp_path / "picture.png.ocr.pdf"
    layers = textlayer.searchable_pdf(source, "image", [None], out, SHA, budget=budget)
    assert layers.pages == ["none"]

    assert budget.granted == 1
    with Image.open(source) as decoded:
        assert budget.peak == image_bytes(decoded.mode, width, height) + 5 * BAND_BYTES
        whole = pdfimage.pdf_pixels(decoded.convert(decoded.mode))
    with pikepdf.open(out) as pdf:
        (image,) = pdf.pages[0].get_images().values()
        assert pikepdf.PdfImage(image).as_pil_image().tobytes() == whole.tobytes()


# --- errors ---------------------------------------------------------------------------------------


def test_unreadable_sources_raise_the_document_errors(tmp_path: Path) -> None:
    corrupt = docs.write_corrupt_pdf(tmp_path / "bad.pdf")
    with pytest.raises(CorruptPdf):
        textlayer.searchable_pdf(corrupt, "pdf", [None], io.BytesIO(), SHA)
    two = docs.write_pdf(tmp_path / "two.pdf", [["a"], ["b"]])
    with pytest.raises(CorruptPdf, match="2 pages"):
        textlayer.searchable_pdf(two, "pdf", [None], io.BytesIO(), SHA)
    truncated = docs.write_truncated_png(tmp_path / "cut.png")
    with pytest.raises(CorruptImage):
        textlayer.searchable_pdf(truncated, "image", [None], io.BytesIO(), SHA)
    with pytest.raises(FileNotFoundError):
        textlayer.searchable_pdf(tmp_path / "gone.png", "image", [None], io.BytesIO(), SHA)


# --- the shared corpus: born-digital pages rendered as images -------------------------------------

CORPUS_PAGES = [("google-doc-document.pdf", 0), ("small-table.pdf", 0), ("tracemonkey.pdf", 0)]


def test_corpus_born_digital_pages(
    corpus_dir: Path, manifest: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Born-digital pages rendered as images (a scan of them, no text of their own): the text layer
    gives back what Tesseract read (>= 0.9); how close that is to the page's own text is printed,
    not asserted."""
    known = {entry["file"]: entry for entry in manifest}
    figures = {}
    for name, index in CORPUS_PAGES:
        assert "born_digital" in known[name]["tags"]
        original = corpus_dir / name
        info = render.probe(original, render.Limits.from_config(LimitsConfig()))
        spec = render.render_spec(RenderConfig(), TesseractEngine(TesseractConfig()).geometry)
        scan = page_pdf(
            tmp_path / f"scan-{name}",
            render.render_page(original, info, index, spec).image,
            dpi=spec.dpi,
        )
        pages = ocr(scan)
        out = tmp_path / f"{name}.ocr.pdf"
        textlayer.searchable_pdf(scan, "pdf", texts(pages), out, SHA)
        qpdf_check(out)
        layer, markdown = page_texts(out)[0], pages[0][1].markdown
        own = pdftotext(original, "-f", str(index + 1), "-l", str(index + 1))
        figures[name] = {
            "layer_vs_markdown": round(similarity(layer, markdown), 3),
            "layer_vs_page_text": round(similarity(layer, own), 3),
        }
    print(json.dumps(figures))
    assert all(figure["layer_vs_markdown"] >= 0.9 for figure in figures.values()), figures
