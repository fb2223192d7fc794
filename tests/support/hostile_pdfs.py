"""PDFs built to exhaust a reader: a form small on disk that decodes to a great many bytes, forms
nested thousands deep, and an image of a few hundred bytes that declares gigapixels. Made at test
time (megabytes on disk, gigabytes decoded)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pikepdf
from pikepdf import Dictionary, Name
from PIL import Image

MiB = 1024 * 1024


def zeros_flate(decoded: int) -> bytes:
    """``decoded`` zero bytes, Flate-compressed (about 1,000 to 1): 2 GiB take 2 MB."""
    compressor, block = zlib.compressobj(9), bytes(min(decoded, 16 * MiB))
    parts = []
    for start in range(0, decoded, len(block)):
        parts.append(compressor.compress(block[: min(len(block), decoded - start)]))
    return b"".join(parts) + compressor.flush()


def write_form_bomb(path: Path, decoded: int, *, drawn: bool = False, text: str = "") -> Path:
    """One page whose resources list a form of ``decoded`` zero bytes (zeros are whitespace to a
    content parser), drawn by the page only if ``drawn``; with ``text``, the page shows it too."""
    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(612, 792))
    form = pdf.make_stream(b"", Type=Name.XObject, Subtype=Name.Form, BBox=[0, 0, 612, 792])
    form.write(zeros_flate(decoded), filter=Name.FlateDecode)
    font = Dictionary(Type=Name.Font, Subtype=Name.Type1, BaseFont=Name.Helvetica)
    page.obj.Resources = Dictionary(XObject=Dictionary(Fx=form), Font=Dictionary(F1=font))
    shown = f"BT /F1 24 Tf 72 700 Td ({text}) Tj ET " if text else ""
    page.obj.Contents = pdf.make_stream((shown + ("q /Fx Do Q" if drawn else "")).encode())
    pdf.save(path, compress_streams=False)
    return path


def write_nested_forms(path: Path, depth: int, *, text: str = "") -> Path:
    """One page that draws a form that draws a form ... ``depth`` forms deep; the innermost shows
    ``text`` (or draws a line)."""
    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(612, 792))
    font = Dictionary(Type=Name.Font, Subtype=Name.Type1, BaseFont=Name.Helvetica)
    inner = pdf.make_stream(
        f"BT /F1 12 Tf 72 72 Td ({text}) Tj ET".encode() if text else b"0 0 m 10 10 l S",
        Type=Name.XObject,
        Subtype=Name.Form,
        BBox=[0, 0, 612, 792],
        Resources=Dictionary(Font=Dictionary(F1=font)),
    )
    for _ in range(depth - 1):
        inner = pdf.make_stream(
            b"q /Fn Do Q",
            Type=Name.XObject,
            Subtype=Name.Form,
            BBox=[0, 0, 612, 792],
            Resources=Dictionary(XObject=Dictionary(Fn=inner)),
        )
    page.obj.Resources = Dictionary(XObject=Dictionary(Fn=inner))
    page.obj.Contents = pdf.make_stream(b"q /Fn Do Q")
    pdf.save(path)
    return path


def jpx_codestream(width: int, height: int) -> bytes:
    """A JPEG 2000 codestream that declares ``width`` x ``height`` pixels (grey, one tile) and holds
    the data of 16 x 16: a few hundred bytes that a decoder allocates the declared image for."""
    buffer = io.BytesIO()
    Image.new("L", (16, 16), 255).save(buffer, "JPEG2000", irreversible=False, no_jp2=True)
    data = bytearray(buffer.getvalue())
    siz = data.index(b"\xff\x51")  # Xsiz, Ysiz, XOsiz, YOsiz, XTsiz, YTsiz after Lsiz and Rsiz
    struct.pack_into(">IIIIII", data, siz + 6, width, height, 0, 0, width, height)
    return bytes(data)


def write_declared_image_pdf(
    path: Path,
    width: int,
    height: int,
    *,
    jpx: bool = True,
    dictionary: tuple[int, int] | None = None,
    where: str = "page",
) -> Path:
    """One page drawing an image that declares ``width`` x ``height`` pixels and holds next to
    nothing: a JPEG 2000 codestream (``jpx``) or a few bytes of Flate. ``dictionary``: other
    /Width and /Height for its dictionary than the codestream's. ``where`` it is listed: the
    page's resources, inherited from the page tree ("inherited"), a form the page draws ("form"),
    an annotation's appearance ("annotation"), or nowhere: inline in the page's content
    ("inline"), where no dictionary lists it."""
    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(612, 792))
    shown_width, shown_height = dictionary or (width, height)
    data = jpx_codestream(width, height) if jpx else zlib.compress(bytes(4096))
    if where == "inline":
        filter_ = b"/JPXDecode" if jpx else b"/FlateDecode"
        head = b"BI /W %d /H %d /CS /G /BPC 8 /F %s /L %d ID " % (
            shown_width,
            shown_height,
            filter_,
            len(data),
        )
        page.obj.Contents = pdf.make_stream(b"q 612 0 0 792 0 0 cm " + head + data + b"\nEI Q")
        pdf.save(path)
        return path
    image = pdf.make_stream(
        data,
        Type=Name.XObject,
        Subtype=Name.Image,
        Width=shown_width,
        Height=shown_height,
        ColorSpace=Name.DeviceGray,
        BitsPerComponent=8,
        Filter=Name.JPXDecode if jpx else Name.FlateDecode,
    )
    draw = b"q 612 0 0 792 0 0 cm /Im0 Do Q"
    images = Dictionary(XObject=Dictionary(Im0=image))
    if where == "page":
        page.obj.Resources = images
    elif where == "inherited":
        del page.obj.Resources
        pdf.Root.Pages.Resources = images
    else:
        form = pdf.make_stream(
            draw, Type=Name.XObject, Subtype=Name.Form, BBox=[0, 0, 612, 792], Resources=images
        )
        if where == "form":
            page.obj.Resources = Dictionary(XObject=Dictionary(Fm0=form))
            draw = b"/Fm0 Do"
        else:
            annotation = Dictionary(
                Type=Name.Annot, Subtype=Name.Square, Rect=[0, 0, 612, 792], AP=Dictionary(N=form)
            )
            page.obj.Annots = pdf.make_indirect(pikepdf.Array([annotation]))
            draw = b""
    page.obj.Contents = pdf.make_stream(draw)
    pdf.save(path)
    return path
