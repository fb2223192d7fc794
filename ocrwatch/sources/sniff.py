"""What a document is, from its first bytes: the one sniffer that the inbox and the renderer share.

The inbox uses it to know which trailer marks a file as whole; the renderer uses it to choose the
probe. Both must agree, or a file would be waited on as one format and rendered as another.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["pdf", "png", "jpeg", "tiff", "webp"]

HEAD_BYTES = 1024
"""Bytes a caller reads for ``sniff``: a PDF header may follow up to 1 KiB of junk; poppler and
Acrobat accept that."""

MIME: dict[Kind, str] = {
    "pdf": "application/pdf",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "tiff": "image/tiff",
    "webp": "image/webp",
}

_IMAGE_MAGIC: tuple[tuple[bytes, Kind], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),  # BigTIFF
    (b"MM\x00+", "tiff"),
)


def sniff(head: bytes) -> Kind | None:
    """The format by magic bytes, or None where there is none. None is not yet "not a document": the
    renderer asks poppler whether it is a PDF whose header lies beyond ``HEAD_BYTES`` or is missing,
    as tolerant readers accept; the inbox, with no trailer to wait for, takes it as whole.

    Images are checked at offset 0 before the looser PDF header search, which looks anywhere in the
    first ``HEAD_BYTES``: an image whose pixels happen to contain ``%PDF-`` is still an image.
    """
    for magic, kind in _IMAGE_MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if b"%PDF-" in head[:HEAD_BYTES]:
        return "pdf"
    return None
