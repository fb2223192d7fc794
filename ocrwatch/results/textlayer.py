"""The searchable PDF: the source's pages with an invisible text layer where the engine read the
text.

A PDF source keeps its page objects and content streams as they are (saved without decoding a
stream); each page gains one Form XObject holding its text, drawn before the page's own content
through one new content stream. An image source becomes one page per frame (TIFF) or one page, the
image at its DPI: a JPEG's own bytes, other formats as lossless Flate pixels, its EXIF orientation
applied by the image's placement.

The text follows OCRmyPDF's text layer: each line sits on one baseline at the bottom of its box,
with the box's height as font size, so extractors group its words into a line; each word is
stretched (``Tz``) over its own box and a space over the gap to the next word, so word breaks
survive extraction. The font is Tesseract's glyphless font (Type0, Identity-H, UTF-16 codes mapped
to themselves by the ToUnicode CMap): any character of the Basic Multilingual Plane is searchable,
and the text is invisible (render mode 3).

Boxes come in the pixels of the page as it was read, turned upright (``orientation``); they map
back onto the rendered page through ``orientation.to_shown`` and onto the PDF page through its
visible box (the CropBox within the MediaBox, wherever its origin lies) and its /Rotate, the way the
renderer rasterised it. So the text lies over its glyphs as a viewer shows the page, sideways on a
page scanned sideways, and the page itself is left as it is.
"""

from __future__ import annotations

import base64
import contextlib
import html
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pikepdf
from pikepdf import Array, Dictionary, Matrix, Name, Pdf
from pikepdf.canvas import ContentStreamBuilder
from PIL import Image

from ocrwatch.engines.base import is_figure
from ocrwatch.errors import CorruptImage, CorruptPdf, EncryptedPdf
from ocrwatch.infra.memory import UNBOUNDED, DecodeBudget
from ocrwatch.pages import imagepages, orientation, pdfcontent
from ocrwatch.results import pdfimage

Box = tuple[float, float, float, float]
"""left, top, right, bottom in page pixels, as the engines' blocks give them."""

MAX_PAGE_POINTS = 14400.0
"""The largest page side PDF viewers accept (200 inches); an image whose DPI would exceed it is
shrunk."""

TextLayer = Literal["own", "ocr", "none"]
"""A page's text in the searchable PDF: its own (left as it is), the engine's, or none (a failed
page, or one whose content could not be read within bounds: ``Layers.skipped`` says why)."""

MARK = "ocrwatch/1"
"""How a searchable PDF ocrwatch wrote begins its ``/OcrwatchSource`` document information entry."""

_MARK_KEY = Name("/OcrwatchSource")
_FONT = "/OcrGlyphless"
_LAYER = "/OcrText"
_CHAR_WIDTH = 0.5  # the glyphless font's advance, in text space units per unit of font size
_SPACE = " ".encode("utf-16-be")

# Tesseract's glyphless TrueType font (tessdata/pdf.ttf, Apache-2.0): one empty glyph, which every
# code maps to.
_GLYPHLESS_TTF = base64.b64decode(
    "AAEAAAAKAIAAAwAgT1MvMlbeyJQAAAEoAAAAYGNtYXAACgA0AAABkAAAAB5nbHlmFSJBJAAAAbgAAAAYaGVhZAt48WUAAACsAAAA"
    "NmhoZWEMAgQCAAAA5AAAACRobXR4BAAAAAAAAYgAAAAIbG9jYQAMAAAAAAGwAAAABm1heHAABAAFAAABCAAAACBuYW1l8usW2gAA"
    "AdAAAABLcG9zdAABAAEAAAIcAAAAIAABAAAAAQAAsJRxEF8PPPUEBwgAAAAAAM+a/G4AAAAA1MOn8gAAAAAEAAgAAAAAEAACAAAA"
    "AAAAAAEAAAgA//8AAAQAAAAAAAQAAAEAAAAAAAAAAAAAAAAAAAACAAEAAAACAAQAAQAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAwAA"
    "AZAABQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAUAAQABAAAAAAAAAAAAAAAAAAAAAAAAAAAAR09PRwBAAAAAAAAB//8AAAABAAGA"
    "AAAAAAAAAAAAAAAAAAABAAAAAAAABAAAAAAAAAIAAQAAAAAAFAADAAAAAAAUAAYACgAAAAAAAAAAAAAAAAAMAAAAAQAAAAAEAAgA"
    "AAMAADEhESEEAPwACAAAAAADACoAAAADAAAABQAWAAAAAQAAAAAABQALABYAAwABBAkABQAWAAAAVgBlAHIAcwBpAG8AbgAgADEA"
    "LgAwVmVyc2lvbiAxLjAAAAEAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAA="
)
_CID_TO_GID = zlib.compress(b"\x00\x01" * 65536)  # every code to the one glyph
# Every two-byte code is its own UTF-16 unit: the text is written as UTF-16BE, so extraction reads
# it back.
_TO_UNICODE = b"""/CIDInit /ProcSet findresource begin
12 dict begin
begincmap
/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def
/CMapName /Adobe-Identity-UCS def
/CMapType 2 def
1 begincodespacerange
<0000> <FFFF>
endcodespacerange
1 beginbfrange
<0000> <FFFF> <0000>
endbfrange
endcmap
CMapName currentdict /CMap defineresource pop
end
end
"""
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)[^<>]*>")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class LayerWord:
    """A piece of text and the box it spans; spaces inside it are kept (a DeepSeek line is one
    LayerWord)."""

    text: str
    box: Box


@dataclass(frozen=True)
class LayerLine:
    """Words on one baseline: the bottom of ``box``, whose height is the font size."""

    box: Box
    words: tuple[LayerWord, ...]


@dataclass(frozen=True)
class Layers:
    """Each page's text layer, and why each page that got none because its own content could not
    be read within bounds did (``pdfcontent.CONTENT_TOO_LARGE``, ``FORMS_TOO_DEEP``): the JSON's
    ``text_layer`` and ``text_layer_skipped``."""

    pages: list[TextLayer]
    skipped: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class PageText:
    """A page's text as recognised: the size in pixels of the page as read, its lines in reading
    order, and how that page was turned from the rendered one."""

    width: int
    height: int
    lines: tuple[LayerLine, ...]
    turned: orientation.Orientation = orientation.AS_RENDERED


def page_text(
    width: int,
    height: int,
    blocks: Sequence[dict[str, Any]],
    turned: orientation.Orientation = orientation.AS_RENDERED,
) -> PageText:
    """A page's text from its blocks as the engines give them (the JSON's ``pages[i].blocks``).

    A block with ``words`` (Tesseract's lines) is a line of those words. Any other block with text
    (DeepSeek's grounding blocks) has its lines spread evenly over its box, or over its ``boxes`` in
    order when it spans several, each line stretched over the box's width; a block without a box
    spans the page. Figures (``engines.base.is_figure``) carry no text.
    """
    lines: list[LayerLine] = []
    for block in blocks:
        words = [
            LayerWord(word["text"], _box(word["bbox"]))
            for word in block.get("words") or ()
            if word.get("bbox")
        ]
        if words:
            lines.append(
                LayerLine(_box(box) if (box := block.get("bbox")) else _union(words), tuple(words))
            )
        elif not is_figure(block):
            texts = plain_lines(str(block.get("text") or ""))
            boxes = [
                _box(box)
                for box in block.get("boxes") or [block.get("bbox") or (0, 0, width, height)]
            ]
            lines.extend(_spread(texts, boxes))
    return PageText(width, height, tuple(lines), turned)


def searchable_pdf(
    source: Path,
    kind: Literal["pdf", "image"],
    pages: Sequence[PageText | None],
    out: BinaryIO | Path,
    sha256: str,
    *,
    budget: DecodeBudget = UNBOUNDED,
    sizes: Sequence[tuple[float, float] | None] = (),
) -> Layers:
    """Write ``source`` with its text layer to ``out``, marked as ocrwatch's for the source of
    ``sha256`` (``is_ours``); ``pages`` has one entry per page (None: the page failed and gets no
    text). Each page's layer: ``own`` (a PDF page that already carries text keeps it and gets none,
    as OCRmyPDF's ``--skip-text`` does, so no extractor reads its lines twice), ``ocr`` or ``none``.
    What it decodes (a page's content, an image's pixels) is held within ``budget``, the one the
    renderer decodes within. An image source's pages take ``sizes`` (points, as the renderer
    measured each page: its pixels at its DPI, the sidecar's ``width``, ``height`` and ``dpi``); one
    without is sized by the renderer's rule (``imagepages.image_dpi``). Raises CorruptPdf,
    EncryptedPdf or CorruptImage when the source cannot be read again, and OSError when ``out``
    cannot be written."""
    layers = Layers([])
    if kind == "pdf":
        pdf = _open_pdf(source)
        with pdf:
            if len(pdf.pages) != len(pages):
                raise CorruptPdf(
                    f"{source}: qpdf reads {len(pdf.pages)} pages, the renderer read {len(pages)}"
                )
            font = _glyphless_font(pdf)
            for number, (page, text) in enumerate(zip(pdf.pages, pages, strict=True), 1):
                drawn = pdfcontent.read_page(page, budget)
                if drawn.refused is not None:  # it may have text of its own; ours would double it
                    layers.pages.append("none")
                    skipped = {"page": number, "reason": drawn.refused, "message": drawn.detail}
                    layers.skipped.append(skipped)
                elif drawn.text:
                    layers.pages.append("own")
                elif text is not None and text.lines:
                    _add_text(pdf, page, text, font)
                    layers.pages.append("ocr")
                else:
                    layers.pages.append("none")
            _mark(pdf, sha256)
            # No stream is decoded, compressed or encoded again: the original pages keep their exact
            # bytes. An encrypted source (one that opens without a password) keeps its encryption
            # and permissions; qpdf encrypts its streams again at its own decode level, under a new
            # random ID.
            keep: dict[str, Any] = (
                {"encryption": True}
                if pdf.is_encrypted
                else {
                    "stream_decode_level": pikepdf.StreamDecodeLevel.none,
                    "deterministic_id": True,
                }
            )
            pdf.save(out, compress_streams=False, **keep)
        return layers
    with Pdf.new() as pdf:
        _image_pages(pdf, source, pages, budget, sizes)
        _mark(pdf, sha256)
        pdf.save(out, deterministic_id=True)
    return Layers(["ocr" if text is not None and text.lines else "none" for text in pages])


def is_ours(content: BinaryIO) -> bool:
    """Whether ``content`` (a seekable file) is a searchable PDF ocrwatch wrote (``_mark``): one
    that a write killed before its JSON left is then ocrwatch's to replace, and anything else stays
    the user's. qpdf reads only the cross-reference table and the document information, never the
    whole file."""
    try:
        with Pdf.open(content, attempt_recovery=False) as pdf:
            info = pdf.trailer.get(Name.Info)
            return isinstance(info, Dictionary) and str(info.get(_MARK_KEY, "")).startswith(
                f"{MARK} "
            )
    except (pikepdf.PdfError, pikepdf.PasswordError, ValueError, OSError):
        return False


def _mark(pdf: Pdf, sha256: str) -> None:
    """Sign the document information: ``MARK`` and the sha256 of the source it was made of."""
    pdf.docinfo[_MARK_KEY] = f"{MARK} sha256:{sha256}"


def _open_pdf(source: Path) -> Pdf:
    try:
        return Pdf.open(source)
    except pikepdf.PasswordError:
        raise EncryptedPdf(f"{source}: the PDF needs a password to open") from None
    except pikepdf.PdfError as exc:
        raise CorruptPdf(f"{source}: qpdf cannot read it: {exc}") from None


def _add_text(pdf: Pdf, page: pikepdf.Page, text: PageText, font: Dictionary) -> None:
    """Draw ``text`` as a Form XObject under the page's content, over its glyphs as the page is
    displayed. The form's space is the pixels of the page as read (y up), mapped to the rendered
    page's pixels (``orientation.to_shown``), to the displayed page's points and to the page's user
    space."""
    left, bottom, right, top = _visible_box(page)
    rotation = page.rotation if page.rotation in (0, 90, 180, 270) else 0
    width, height = (
        (top - bottom, right - left) if rotation in (90, 270) else (right - left, top - bottom)
    )
    shown_w, shown_h = (text.width, text.height)
    if text.turned.rotation in (90, 270):
        shown_w, shown_h = shown_h, shown_w
    matrix = (
        Matrix(1, 0, 0, -1, 0, text.height)  # y up to y down
        @ Matrix(*orientation.to_shown(text.turned, text.width, text.height))
        @ Matrix(width / shown_w, 0, 0, -height / shown_h, 0, height)  # to the displayed points
        @ _display_to_user((left, bottom, right, top), rotation)
    )
    form = pdf.make_stream(
        zlib.compress(_text_stream(text)),
        Filter=Name.FlateDecode,
        Type=Name.XObject,
        Subtype=Name.Form,
        BBox=[0, 0, text.width, text.height],
        Matrix=Array(matrix.shorthand),
        Resources=Dictionary(Font=Dictionary({_FONT: font})),
    )
    # Pages often share one /Resources (and /XObject) dictionary: the page gets copies of its own,
    # so the layer's name never reaches another page, whose own layer would then be drawn here.
    shared = page.obj.get(Name.Resources)
    resources = Dictionary(dict(shared.items())) if isinstance(shared, Dictionary) else Dictionary()
    xobjects = resources.get(Name.XObject)
    resources[Name.XObject] = (
        Dictionary(dict(xobjects.items())) if isinstance(xobjects, Dictionary) else Dictionary()
    )
    name, number = Name(_LAYER), 1
    while name in resources[Name.XObject]:
        number += 1
        name = Name(f"{_LAYER}{number}")
    resources[Name.XObject][name] = form
    page.obj[Name.Resources] = resources
    page.contents_add(ContentStreamBuilder().push().draw_xobject(name).pop().build(), prepend=True)


def _text_stream(text: PageText) -> bytes:
    """The text operators in the space of the page as read: its pixels, origin at the bottom left.
    Written directly, not through pikepdf's builder, which costs ten times as much per word (the
    operators are few, and the strings hexadecimal, so nothing needs escaping)."""
    operators = [b"BT 3 Tr"]
    for line in text.lines:
        size = line.box[3] - line.box[1]
        if size <= 0:
            continue
        baseline = text.height - line.box[3]
        operators.append(b"%s %.2f Tf" % (_FONT.encode(), size))
        words = [(word.box, codes) for word in line.words if (codes := _codes(word.text))]
        for (box, codes), following in zip(words, [*words[1:], None], strict=True):
            left, right = box[0], box[2]
            operators.append(_show(codes, left, right, baseline, size))
            # the space is stretched over the gap, so no two words run together
            if following is not None:
                gap_end = max(following[0][0], right + 0.01)
                operators.append(_show(_SPACE, right, gap_end, baseline, size))
    operators.append(b"ET\n")
    return b"\n".join(operators)


def _show(codes: bytes, left: float, right: float, baseline: float, size: float) -> bytes:
    """Show ``codes`` from ``left`` on the baseline, stretched (Tz, in percent) to end at
    ``right``."""
    natural = len(codes) // 2 * _CHAR_WIDTH * size
    stretch = 100 * max(right - left, 0.01) / natural
    return b"1 0 0 1 %.2f %.2f Tm %.2f Tz <%s> Tj" % (left, baseline, stretch, codes.hex().encode())


def _visible_box(page: pikepdf.Page) -> Box:
    """The CropBox clipped to the MediaBox, normalised (a box's corners may come in any order)."""
    media, crop = (_normal(box) for box in (page.mediabox, page.cropbox))
    box = (
        max(media[0], crop[0]),
        max(media[1], crop[1]),
        min(media[2], crop[2]),
        min(media[3], crop[3]),
    )
    return box if box[0] < box[2] and box[1] < box[3] else media


def _display_to_user(box: Box, rotation: int) -> Matrix:
    """The matrix from the displayed page's space (origin bottom left) to the page's user space, for
    a page shown rotated ``rotation`` degrees clockwise."""
    left, bottom, right, top = box
    matrix = {
        0: Matrix(1, 0, 0, 1, left, bottom),
        90: Matrix(0, 1, -1, 0, right, bottom),
        180: Matrix(-1, 0, 0, -1, right, top),
        270: Matrix(0, -1, 1, 0, left, top),
    }[rotation]
    return matrix


# --- image sources --------------------------------------------------------------------------------


def _image_pages(
    pdf: Pdf,
    source: Path,
    pages: Sequence[PageText | None],
    budget: DecodeBudget,
    sizes: Sequence[tuple[float, float] | None],
) -> None:
    """One page per frame, as the renderer counts them: a TIFF's frames, any other image's first
    one. The pixels are decoded within ``budget``, held for the largest frame until the last frame
    is closed."""
    font = _glyphless_font(pdf)
    try:
        with Image.open(source) as image:
            frames = getattr(image, "n_frames", 1) if image.format == "TIFF" else 1
            if frames != len(pages):
                raise CorruptImage(f"{source}: {frames} frames now, the renderer read {len(pages)}")
            # none for a JPEG: no place in the budget's queue
            charge = pdfimage.decode_bytes(image, frames)
            with budget.hold(charge) if charge else contextlib.nullcontext():
                for index, text in enumerate(pages):
                    image.seek(index)
                    size = sizes[index] if index < len(sizes) else None
                    page = _image_page(pdf, image, source, size)
                    if text is not None and text.lines:
                        _add_text(pdf, page, text, font)
                image.close()  # the last frame's pixels go before the budget is given back
    except FileNotFoundError:  # the source is gone, not corrupt: classify() tells the two apart
        raise
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise CorruptImage(f"{source}: {exc}") from None


def _image_page(
    pdf: Pdf, image: Image.Image, source: Path, size: tuple[float, float] | None
) -> pikepdf.Page:
    """A page the size of the displayed image at its DPI (the renderer's, from ``size`` in points),
    the image drawn over all of it."""
    stored_w, stored_h = image.size
    orientation = image.getexif().get(0x0112, 1)
    orientation = orientation if orientation in range(1, 9) else 1
    shown_w, shown_h = (stored_h, stored_w) if orientation >= 5 else (stored_w, stored_h)
    # Its shape from the file's resolutions across and down (a fax's differ), rounded as the
    # renderer rounds them: PNG stores dots per metre (200 dpi reads 199.9996).
    dpi = [round(d, 2) for d in imagepages.image_dpi(image.info.get("dpi"), image.size, None)[0]]
    across, down = dpi[::-1] if orientation >= 5 else dpi
    width, height = shown_w * 72 / across, shown_h * 72 / down
    # Its size from the renderer's (its DPI is scaled with the image), at most MAX_PAGE_POINTS.
    long_side = min(max(size) if size is not None else max(width, height), MAX_PAGE_POINTS)
    width, height = (side * long_side / max(width, height) for side in (width, height))
    page = pdf.add_blank_page(page_size=(width, height))
    name = page.add_resource(pdfimage.image_xobject(pdf, image, source), Name.XObject, Name("/Im0"))

    def place(u: float, v: float) -> tuple[float, float]:  # the image's unit square to the page
        x, y = pdfimage.orient(u * stored_w, (1 - v) * stored_h, stored_w, stored_h, orientation)
        return x * width / shown_w, height - y * height / shown_h

    e, f = place(0, 0)
    (a, b), (c, d) = ((x - e, y - f) for x, y in (place(1, 0), place(0, 1)))
    page.contents_add(
        ContentStreamBuilder().push().cm(Matrix(a, b, c, d, e, f)).draw_xobject(name).pop().build(),
        prepend=False,
    )
    return page


# --- text -----------------------------------------------------------------------------------------


def _glyphless_font(pdf: Pdf) -> Dictionary:
    """The Type0 font every page's text uses: two-byte codes, each drawn with the one empty
    glyph."""
    descriptor = pdf.make_indirect(
        Dictionary(
            Type=Name.FontDescriptor,
            FontName=Name.GlyphLessFont,
            Flags=5,
            FontBBox=[0, 0, 500, 1000],
            ItalicAngle=0,
            Ascent=1000,
            Descent=-1,
            CapHeight=1000,
            StemV=80,
            FontFile2=pdf.make_stream(_GLYPHLESS_TTF),
        )
    )
    cid_font = Dictionary(
        Type=Name.Font,
        Subtype=Name.CIDFontType2,
        BaseFont=Name.GlyphLessFont,
        FontDescriptor=descriptor,
        CIDSystemInfo=Dictionary(Registry="Adobe", Ordering="Identity", Supplement=0),
        DW=int(_CHAR_WIDTH * 1000),
        CIDToGIDMap=pdf.make_stream(_CID_TO_GID, Filter=Name.FlateDecode),
    )
    return pdf.make_indirect(
        Dictionary(
            Type=Name.Font,
            Subtype=Name.Type0,
            BaseFont=Name.GlyphLessFont,
            Encoding=Name("/Identity-H"),
            DescendantFonts=[pdf.make_indirect(cid_font)],
            ToUnicode=pdf.make_stream(_TO_UNICODE),
        )
    )


def _codes(text: str) -> bytes:
    """UTF-16BE of the text, NFKC-normalised (ligatures split); characters beyond the Basic
    Multilingual Plane become U+FFFD, since the identity CMap maps single two-byte units; control
    characters are dropped."""
    text = unicodedata.normalize("NFKC", text)
    kept = "".join(
        "\ufffd" if ord(char) > 0xFFFF else char
        for char in text
        if unicodedata.category(char) != "Cc"
    )
    return kept.encode("utf-16-be")


def plain_lines(markdown: str) -> list[str]:
    """A block's Markdown as the lines a reader sees: a table row per line, no tags, no heading
    marks."""
    text = html.unescape(_TAG.sub(lambda tag: "\n" if _breaks(tag) else " ", markdown))
    lines = (_SPACES.sub(" ", _HEADING.sub("", line)).strip() for line in text.splitlines())
    return [line for line in lines if line]


def _breaks(tag: re.Match[str]) -> bool:
    """Whether an HTML tag ends a line: a table row, paragraph or list item closing, or a line
    break."""
    name = tag.group(2).lower()
    return name == "br" or (tag.group(1) == "/" and name in ("tr", "p", "li", "div"))


def _spread(texts: list[str], boxes: list[Box]) -> list[LayerLine]:
    """Lines of equal height down the boxes taken as one column, each in the box that holds its
    middle."""
    heights = [max(box[3] - box[1], 0.0) for box in boxes]
    total = sum(heights)
    if not texts or total <= 0:
        return []
    step, lines = total / len(texts), []
    for number, text in enumerate(texts):
        offset, middle = 0.0, (number + 0.5) * step
        for box, box_height in zip(boxes, heights, strict=True):
            if middle < offset + box_height or box is boxes[-1]:
                break
            offset += box_height
        top = box[1] + max(number * step - offset, 0.0)
        bottom = box[1] + min((number + 1) * step - offset, box_height)
        line_box = (box[0], top, box[2], bottom)
        lines.append(LayerLine(line_box, (LayerWord(text, line_box),)))
    return lines


def _box(values: Sequence[float]) -> Box:
    left, top, right, bottom = (float(value) for value in values)
    return left, top, right, bottom


def _normal(values: Iterable[Any]) -> Box:
    x0, y0, x1, y1 = (float(value) for value in values)
    return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def _union(words: Sequence[LayerWord]) -> Box:
    return (
        min(w.box[0] for w in words),
        min(w.box[1] for w in words),
        max(w.box[2] for w in words),
        max(w.box[3] for w in words),
    )
