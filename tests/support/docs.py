"""Test documents made at test time, so a clone without the corpus still tests the essentials.

Every ``write_*`` function writes one file and returns its path. ``pages`` arguments take, per page,
either a PIL image or a list of text lines (drawn by ``text_image``). Text is drawn with Pillow's
bundled font (``ImageFont.load_default``), never a system font, large enough that Tesseract reads it
reliably at the default 150 dpi (about 40 px capital height). Needs only Pillow and pypdf; PDFs are
written by a small serialiser here, so their structure (page size, /Rotate, a text layer) is exact
and known.

    from tests.support import docs
    pdf = docs.write_pdf(tmp_path / "a.pdf", [["Invoice 42", "Total 17.50"], ["Page two"]])
    tif = docs.write_tiff(tmp_path / "scan.tif", [["first"], ["second"], ["third"]])
    bad = docs.write_encrypted_pdf(tmp_path / "locked.pdf")            # user password "secret"
    # opens without a password:
    ok = docs.write_encrypted_pdf(tmp_path / "open.pdf", user_password="")
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter

A4_150DPI = (1240, 1754)
FONT_PX = 56
LINE_PX = 84
MARGIN_PX = 100

Page = Image.Image | Sequence[str]


def text_image(
    lines: Sequence[str], size: tuple[int, int] = A4_150DPI, font_px: int = FONT_PX
) -> Image.Image:
    """Black text on white (mode "L"), one line per entry, starting at the top-left margin."""
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_px)
    for number, line in enumerate(lines):
        draw.text(
            (MARGIN_PX, MARGIN_PX + number * LINE_PX * font_px // FONT_PX), line, fill=0, font=font
        )
    return image


def as_image(page: Page) -> Image.Image:
    return page if isinstance(page, Image.Image) else text_image(list(page))


# --- PDF ------------------------------------------------------------------------------------------


def write_pdf(
    path: Path, pages: Sequence[Page], dpi: float = 150, *, text_layer: bool = False
) -> Path:
    """A PDF with one full-page image per page, each page sized so the image is ``dpi`` dots per
    inch.

    With ``text_layer`` (pages given as lines), the lines are also laid invisibly over the image in
    Helvetica, like an OCRmyPDF output: pdftotext finds them, rendering needs no font.
    """
    path.write_bytes(_pdf_bytes(_image_pages(pages, dpi, text_layer)))
    return path


def write_huge_page_pdf(path: Path, inches: float = 200.0) -> Path:
    """One square page of ``inches`` per side (200 in is the largest page PDF allows), big text on
    it."""
    image = text_image(["HUGE POSTER"], size=(800, 800), font_px=90)
    path.write_bytes(_pdf_bytes([_PdfPage(image, (inches * 72, inches * 72))]))
    return path


def write_sized_pdf(
    path: Path, sizes_pt: Sequence[tuple[float, float]], rotate: Sequence[int] = ()
) -> Path:
    """Pages of the given sizes in points (each with a small grey image), and optional /Rotate per
    page."""
    specs = []
    for number, size_pt in enumerate(sizes_pt):
        image = text_image([f"page {number + 1}"], size=(400, 400), font_px=40)
        specs.append(_PdfPage(image, size_pt, rotate=rotate[number] if number < len(rotate) else 0))
    path.write_bytes(_pdf_bytes(specs))
    return path


def write_encrypted_pdf(
    path: Path, user_password: str = "secret", pages: Sequence[Page] = (("Encrypted page",),)
) -> Path:
    """An RC4-128 encrypted PDF (pypdf, no crypto library needed); ``user_password=""`` opens
    without one."""
    plain = io.BytesIO(_pdf_bytes(_image_pages(pages)))
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="RC4-128")
    with open(path, "wb") as handle:
        writer.write(handle)
    return path


def write_truncated_pdf(
    path: Path, pages: Sequence[Page] = (("Truncated",), ("Second page",))
) -> Path:
    """A PDF cut in the middle: its page tree, xref and trailer are lost, as after an interrupted
    copy."""
    data = _pdf_bytes(_image_pages(pages))
    path.write_bytes(data[: len(data) // 2])
    return path


def write_zero_page_pdf(path: Path) -> Path:
    """A well-formed PDF whose page tree is empty (/Count 0)."""
    writer = PdfWriter()
    with open(path, "wb") as handle:
        writer.write(handle)
    return path


def write_corrupt_pdf(path: Path) -> Path:
    """A PDF header and end marker with nothing between them."""
    path.write_bytes(b"%PDF-1.4\n%%EOF\n")
    return path


# --- images ---------------------------------------------------------------------------------------


def write_png(path: Path, page: Page, dpi: float | None = 150) -> Path:
    """Saved as-is, so an "RGBA", "1" or "I;16" image stays that mode in the file."""
    image = as_image(page)
    image.save(path, format="PNG", **({"dpi": (dpi, dpi)} if dpi else {}))
    return path


def write_jpeg(path: Path, page: Page, orientation: int | None = None, dpi: float = 150) -> Path:
    """With ``orientation`` (EXIF tag 274: 6 = display rotated 90 degrees clockwise, 8 =
    counter-clockwise, 3 = 180), the pixels are stored pre-rotated the other way, so the correctly
    displayed image equals ``page``."""
    image = as_image(page).convert("RGB")
    undo = {
        3: Image.Transpose.ROTATE_180,
        6: Image.Transpose.ROTATE_90,
        8: Image.Transpose.ROTATE_270,
    }
    exif = Image.Exif()
    if orientation is not None:
        image = image.transpose(undo[orientation]) if orientation in undo else image
        exif[0x0112] = orientation
    image.save(path, format="JPEG", quality=90, dpi=(dpi, dpi), exif=exif.tobytes())
    return path


def write_webp(path: Path, page: Page) -> Path:
    as_image(page).convert("RGB").save(path, format="WEBP", lossless=True)
    return path


def write_tiff(
    path: Path, pages: Sequence[Page], dpi: float = 150, compression: str = "tiff_deflate"
) -> Path:
    """A multi-frame TIFF, one frame per page (``compression="group4"`` wants mode "1" pages)."""
    frames = [as_image(page) for page in pages]
    frames[0].save(
        path,
        format="TIFF",
        save_all=True,
        append_images=frames[1:],
        dpi=(dpi, dpi),
        compression=compression,
    )
    return path


def write_fax(path: Path, lines: Sequence[str]) -> Path:
    """A Letter page as a fine fax sends it: 1728 pixels across at 204 dpi, 1078 down at 98 (its
    text drawn at 204 dpi both ways, then halved down), bilevel, Group 4."""
    page = text_image(lines, size=(1728, 2244)).resize((1728, 1078), Image.Resampling.LANCZOS)
    page.point(lambda value: 255 if value > 128 else 0).convert("1").save(
        path, format="TIFF", dpi=(204, 98), compression="group4"
    )
    return path


def write_truncated_png(path: Path, page: Page = ("Truncated image",)) -> Path:
    """A valid PNG header and the first part of its data: opens, fails to decode."""
    buffer = io.BytesIO()
    as_image(page).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


def write_png_bomb(path: Path, width: int = 100_000, height: int = 100_000) -> Path:
    """A tiny PNG whose header declares ``width`` x ``height`` pixels: decoding it would need
    gigabytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    data = zlib.compress(b"\x00" + b"\xff" * 1000)  # a sliver of the first row
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )
    return path


def write_executable(path: Path) -> Path:
    """The start of an ELF executable: a file that is no document, whatever its name says."""
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x02\x00\x3e\x00" + bytes(4000))
    return path


# --- the PDF serialiser ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _PdfPage:
    image: Image.Image
    size_pt: tuple[float, float]
    rotate: int = 0
    text: Sequence[str] = ()
    dpi: float = 150


def _image_pages(
    pages: Sequence[Page], dpi: float = 150, text_layer: bool = False
) -> list[_PdfPage]:
    """One page per image, sized so the image is ``dpi`` dots per inch; text pages may keep their
    lines."""
    specs = []
    for page in pages:
        image = as_image(page)
        text = list(page) if text_layer and not isinstance(page, Image.Image) else []
        specs.append(
            _PdfPage(image, (image.width * 72 / dpi, image.height * 72 / dpi), text=text, dpi=dpi)
        )
    return specs


def _pdf_bytes(pages: Sequence[_PdfPage]) -> bytes:
    """Page objects first, then the font, page tree and catalog last, so a truncated copy loses its
    structure."""
    objects: list[bytes] = []
    page_numbers = []
    count = len(pages)
    font_number, tree_number, catalog_number = 3 * count + 1, 3 * count + 2, 3 * count + 3
    for index, page in enumerate(pages):
        image_number, content_number, page_number = 3 * index + 1, 3 * index + 2, 3 * index + 3
        width, height = page.size_pt
        gray = page.image.convert("L")
        pixels = zlib.compress(gray.tobytes())
        objects.append(
            b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
            b"/BitsPerComponent 8"
            b" /Filter /FlateDecode /Length %d >>\nstream\n"
            % (gray.width, gray.height, len(pixels))
            + pixels
            + b"\nendstream"
        )
        content = b"q %.4f 0 0 %.4f 0 0 cm /Im0 Do Q\n" % (width, height) + _invisible_text(page)
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        objects.append(
            b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %.4f %.4f] /Rotate %d"
            b" /Resources << /XObject << /Im0 %d 0 R >> /Font << /F1 %d 0 R >> >> /Contents %d 0 "
            b"R >>"
            % (tree_number, width, height, page.rotate, image_number, font_number, content_number)
        )
        page_numbers.append(page_number)
    objects.append(
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
    )
    kids = b" ".join(b"%d 0 R" % number for number in page_numbers)
    objects.append(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count))
    objects.append(b"<< /Type /Catalog /Pages %d 0 R >>" % tree_number)

    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        catalog_number,
        xref,
    )
    return bytes(out)


def _invisible_text(page: _PdfPage) -> bytes:
    """Render mode 3 (invisible) text placed where ``text_image`` drew each line."""
    if not page.text:
        return b""
    scale = 72 / page.dpi
    size = FONT_PX * scale
    parts = [b"BT 3 Tr /F1 %.2f Tf" % size]
    for number, line in enumerate(page.text):
        baseline = page.size_pt[1] - (MARGIN_PX + number * LINE_PX + FONT_PX * 0.8) * scale
        escaped = (
            line.encode("cp1252", "replace")
            .replace(b"\\", b"\\\\")
            .replace(b"(", b"\\(")
            .replace(b")", b"\\)")
        )
        parts.append(b"1 0 0 1 %.2f %.2f Tm (%s) Tj" % (MARGIN_PX * scale, baseline, escaped))
    parts.append(b"ET\n")
    return b" ".join(parts)
