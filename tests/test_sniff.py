"""The one sniffer: every format either old sniffer knew, and the inbox and the renderer agreeing on
a file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from ocrwatch.config import LimitsConfig
from ocrwatch.pages import render
from ocrwatch.sources import readiness
from ocrwatch.sources.sniff import HEAD_BYTES, MIME, sniff


def image_bytes(kind: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 90, 40)).save(buffer, kind, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"%PDF-1.7\n", "pdf"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "jpeg"),
        (b"II*\x00\x08\x00\x00\x00", "tiff"),
        (b"MM\x00*\x00\x00\x00\x08", "tiff"),
        (b"II+\x00\x08\x00\x00\x00", "tiff"),  # BigTIFF
        (b"MM\x00+\x00\x08\x00\x00", "tiff"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp"),
    ],
)
def test_each_format_by_its_magic(head: bytes, kind: str) -> None:
    assert sniff(head) == kind
    assert kind in MIME


def test_a_pdf_header_may_follow_junk_within_the_head() -> None:
    assert sniff(b"\x00" * (HEAD_BYTES - 8) + b"%PDF-1.4") == "pdf"
    assert sniff(b"\x00" * HEAD_BYTES + b"%PDF-1.4") is None  # beyond what both callers read


def test_unknown_and_short_content_is_none() -> None:
    for head in (
        b"",
        b"%PD",
        b"plain text\n",
        b"GIF89a\x01\x00",
        b"BM\x36\x00",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",
    ):
        assert sniff(head) is None, head


def test_an_image_that_contains_a_pdf_header_is_an_image() -> None:
    meta = PngInfo()
    meta.add_text("Comment", "%PDF-1.7")
    assert sniff(image_bytes("PNG", pnginfo=meta)) == "png"


def test_the_inbox_and_the_renderer_agree_on_a_png_holding_a_pdf_header(tmp_path: Path) -> None:
    """The inbox waits for the trailer of the format the renderer will read the file as."""
    meta = PngInfo()
    meta.add_text("Comment", "%PDF-1.7")
    data = image_bytes("PNG", pnginfo=meta)
    whole, partial = tmp_path / "whole.png", tmp_path / "partial.png"
    whole.write_bytes(data)
    partial.write_bytes(data[:-12])  # without IEND; a PDF's %%EOF was never the test
    assert readiness.probe(whole, tmp_path) and not readiness.probe(partial, tmp_path)
    info = render.probe(whole, render.Limits.from_config(LimitsConfig()))
    assert (info.kind, info.mime) == ("image", "image/png")
