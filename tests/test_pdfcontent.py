"""What a page draws, read within bounds (ocrwatch/pages/pdfcontent.py): only the forms ``Do``
invokes, iteratively, each once, within a depth and a decoded-byte bound; each filter's decoded size
counted as qpdf decodes it; the tokenizer's reading of strings, arrays, comments and inline
images."""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import pikepdf
import pytest
from pikepdf import Array, Dictionary, Name

from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages import pdfcontent
from ocrwatch.pages.pdfcontent import CONTENT_TOO_LARGE, FORMS_TOO_DEEP, Drawn
from tests.support.hostile_pdfs import MiB, write_form_bomb, write_nested_forms

DRAWABLE = frozenset({"/Fx", "/G", "/F x", "/ID"})


@pytest.mark.parametrize(
    ("content", "shows"),
    [
        (b"BT /F1 12 Tf (Hello) Tj ET", True),
        (b"BT () Tj <> Tj [() 10 ()] TJ ET", False),
        (b"BT [(a) -120 (b)] TJ ET", True),
        (b"BT <48656c6c6f> Tj ET", True),
        (b"(a)'", True),
        (b'1 2 (a)"', True),
        (b"(x)% a comment between\nTj", True),
        (b"(a\\) b (nested) c) Tj", True),
        (b"% (x) Tj\nq Q", False),
        (b"/Span <</ActualText (x)>> BDC () Tj EMC", False),
        (b"BI /W 1 /H 1 /BPC 8 /CS /G ID \x00(x) Tj\xff EI Q", False),
        (b"BI /W 1 /H 1 ID (x) Tj EI (shown) Tj", True),
        (b"/ID 3 (a) Tj", True),
        (b"((unbalanced Tj", False),
        (b"(abc) Tjx [1 2] 0 d", False),
    ],
)
def test_the_scan_finds_a_string_a_text_operator_shows(content: bytes, shows: bool) -> None:
    """Comments, strings inside strings, a dictionary's strings and an inline image's binary data
    show nothing; a non-empty string right before Tj, ', " or in an array before TJ does."""
    assert pdfcontent._scan(content, DRAWABLE)[0] is shows


def test_the_scan_lists_each_drawn_name_once_and_only_those_the_resources_hold() -> None:
    content = b"/Fx Do q /G Do Q /Fx Do /Missing Do /F#20x Do /Im0 gs /GDo [/G Do] (/ID Do)"
    assert pdfcontent._scan(content, DRAWABLE) == (False, ["/Fx", "/G", "/F x"])


def _lzw(data: bytes) -> bytes:
    """PDF's LZW (early change 1), for a stream qpdf decodes and pikepdf cannot encode."""
    table, width, bits, count, out = {bytes([i]): i for i in range(256)}, 9, 0, 0, bytearray()

    def emit(code: int) -> None:
        nonlocal bits, count
        bits, count = (bits << width) | code, count + width
        while count >= 8:
            count -= 8
            out.append((bits >> count) & 0xFF)
        bits &= (1 << count) - 1

    emit(256)
    word = b""
    for byte in data:
        if word + bytes([byte]) in table:
            word += bytes([byte])
            continue
        emit(table[word])
        table[word + bytes([byte])] = len(table) + 2
        width = min(12, (len(table) + 2).bit_length())
        if len(table) + 2 >= 4094:
            emit(256)
            table, width = {bytes([i]): i for i in range(256)}, 9
        word = bytes([byte])
    emit(table[word])
    emit(257)
    return bytes(out + (bytes([(bits << (8 - count)) & 0xFF]) if count else b""))


def _run_length(data: bytes) -> bytes:
    out = bytearray()
    for start in range(0, len(data), 100):
        out += bytes([len(data[start : start + 100]) - 1]) + data[start : start + 100]
    return bytes(out + bytes([257 - 60, ord("Q"), 128]))  # 60 Qs, then the end


CONTENT = b"q BT /F1 12 Tf 72 700 Td (Hello \\) world) Tj ET Q\n" * 3000


@pytest.mark.parametrize(
    ("raw", "filters"),
    [
        (zlib.compress(CONTENT), Name.FlateDecode),
        (
            base64.a85encode(zlib.compress(CONTENT), wrapcol=72) + b"~>",
            Array([Name.ASCII85Decode, Name.FlateDecode]),
        ),
        (CONTENT.hex().encode() + b">", Name.ASCIIHexDecode),
        (_lzw(CONTENT), Name.LZWDecode),
        (_run_length(CONTENT), Name.RunLengthDecode),
    ],
    ids=["flate", "ascii85-flate", "asciihex", "lzw", "runlength"],
)
def test_each_content_filter_is_counted_as_qpdf_decodes_it(raw: bytes, filters: object) -> None:
    """The count that decides whether a stream is decoded at all agrees with what qpdf makes of it,
    for every filter content may use."""
    pdf = pikepdf.new()
    stream = pdf.make_stream(b"")
    stream.write(raw, filter=filters)
    decoded = pdfcontent._decoded(stream)
    assert decoded.startswith(CONTENT)
    assert pdfcontent._decoded_size(stream, 1 << 40) == len(decoded)
    assert pdfcontent._decoded_size(stream, 1000) > 1000


def _page(path: Path) -> tuple[pikepdf.Pdf, pikepdf.Page]:
    pdf = pikepdf.open(path)
    return pdf, pdf.pages[0]


def test_a_form_the_page_never_draws_is_never_decoded(tmp_path: Path) -> None:
    """The page lists a form of 64 MiB of zeros (64 KiB on disk) and draws nothing: no byte of it
    is decoded, and nothing is held of a budget that could not hold the form."""
    source = write_form_bomb(tmp_path / "unused.pdf", 64 * MiB)
    budget = DecodeBudget(MiB)
    pdf, page = _page(source)
    with pdf:
        assert pdfcontent.read_page(page, budget) == Drawn(False)
    assert budget.peak == 0


def test_a_drawn_form_over_the_page_bound_is_refused_after_counting_only(tmp_path: Path) -> None:
    """Drawn, the same kind of form decodes past the page's bound: the page is refused with the
    specific reason, and nothing was held (the count keeps no byte)."""
    source = write_form_bomb(tmp_path / "drawn.pdf", 64 * MiB, drawn=True)
    budget = DecodeBudget(MiB)
    pdf, page = _page(source)
    with pdf:
        drawn = pdfcontent.read_page(page, budget, limit=16 * MiB)
    assert (drawn.text, drawn.refused) == (False, CONTENT_TOO_LARGE)
    assert "16 MiB" in drawn.detail
    assert budget.peak == 0


def test_a_drawn_form_within_the_bound_is_decoded_within_the_budget(tmp_path: Path) -> None:
    source = write_form_bomb(tmp_path / "drawn.pdf", 4 * MiB, drawn=True, text="Own words")
    budget = DecodeBudget(64 * MiB)
    pdf, page = _page(source)
    with pdf:
        assert pdfcontent.read_page(page, budget) == Drawn(True)
    budget = DecodeBudget(64 * MiB)
    pdf, page = _page(write_form_bomb(tmp_path / "zeros.pdf", 4 * MiB, drawn=True))
    with pdf:
        assert pdfcontent.read_page(page, budget) == Drawn(False)
    assert budget.peak == 3 * 4 * MiB


def test_forms_nested_five_thousand_deep_are_refused_without_recursion(tmp_path: Path) -> None:
    """Read by recursion, 5,000 nested forms raised RecursionError (an internal_error): walked from
    a work list, the page is refused at the depth bound with the specific reason."""
    pdf, page = _page(write_nested_forms(tmp_path / "deep.pdf", 5000, text="Deep"))
    with pdf:
        drawn = pdfcontent.read_page(page)
    assert (drawn.text, drawn.refused) == (False, FORMS_TOO_DEEP)
    pdf, page = _page(write_nested_forms(tmp_path / "shallow.pdf", 30, text="Deep"))
    with pdf:
        assert pdfcontent.read_page(page) == Drawn(True)


def _form(pdf: pikepdf.Pdf, content: bytes) -> pikepdf.Stream:
    return pdf.make_stream(content, Type=Name.XObject, Subtype=Name.Form, BBox=[0, 0, 9, 9])


def test_forms_that_draw_each_other_are_each_read_once() -> None:
    pdf = pikepdf.new()
    page = pdf.add_blank_page()
    first, second = _form(pdf, b"/B Do"), _form(pdf, b"/A Do /A Do")
    xobjects = Dictionary(A=first, B=second)
    first.Resources = second.Resources = Dictionary(XObject=xobjects)
    page.obj.Resources = Dictionary(XObject=xobjects)
    page.obj.Contents = pdf.make_stream(b"/A Do")
    assert pdfcontent.read_page(page) == Drawn(False)


def test_a_million_tiny_forms_are_bounded_too() -> None:
    """Each form drawn counts a fixed cost against the page's bound, so breadth is bounded as well
    as bytes and depth."""
    pdf = pikepdf.new()
    page = pdf.add_blank_page()
    forms = {f"/F{number}": _form(pdf, b"0 0 m") for number in range(300)}
    page.obj.Resources = Dictionary(XObject=Dictionary(forms))
    page.obj.Contents = pdf.make_stream(b" ".join(f"{name} Do".encode() for name in forms))
    limit = 100 * pdfcontent.FORM_BYTES
    assert pdfcontent.read_page(page, limit=limit).refused == CONTENT_TOO_LARGE
    assert pdfcontent.read_page(page).refused is None
