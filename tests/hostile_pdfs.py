"""PDFs built to exhaust a reader: a form small on disk that decodes to a great many bytes, and
forms nested thousands deep. Made at test time (megabytes on disk, gigabytes decoded)."""

from __future__ import annotations

import zlib
from pathlib import Path

import pikepdf
from pikepdf import Dictionary, Name

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
