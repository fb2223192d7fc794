"""What settling looks at: whether the file a name stands for is whole yet (its signature is
``sourcefile.inspect``).

It is blocking and cheap (a ``stat``, a header and a trailer, never a full parse), and both go
through ``sourcefile``: no link is followed, on the way or at the end, and nothing but a regular
file is opened, so a FIFO dropped in an inbox cannot hang a worker thread. The format comes from
``ocrwatch.sources.sniff``, the renderer's own sniffer, so a file is waited on as the format it will
be rendered as.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from PIL import Image

from ocrwatch.errors import NotARegularFile, SourceGone
from ocrwatch.sources.sniff import HEAD_BYTES, sniff
from ocrwatch.sources.sourcefile import open_file

TAIL_BYTES = 2048
MIN_SNIFF_BYTES = 12


def looks_complete(kind: str | None, head: bytes, tail: bytes, size: int) -> bool:
    """Whether a file of this format has its end: the trailer a writer puts there last."""
    if kind == "pdf":
        return b"%%EOF" in tail
    if kind == "png":
        return b"IEND\xaeB`\x82" in tail
    if kind == "jpeg":
        return tail.rstrip(b"\x00").endswith(b"\xff\xd9")
    if kind == "webp":
        return int.from_bytes(head[4:8], "little") + 8 <= size
    return True


def _tiff_complete(handle: BinaryIO, size: int) -> bool:
    """Every frame's strips or tiles lie inside the file: a TIFF has no trailer to look for."""
    try:
        with Image.open(handle) as image:
            for index in range(getattr(image, "n_frames", 1)):
                image.seek(index)
                tags = getattr(image, "tag_v2", {})
                offsets, counts = (
                    tags.get(273) or tags.get(324) or (),
                    tags.get(279) or tags.get(325) or (),
                )
                if isinstance(offsets, int):
                    offsets, counts = (offsets,), (counts,)
                if any(
                    offset + length > size for offset, length in zip(offsets, counts, strict=False)
                ):
                    return False
    except Exception:  # Pillow raises many kinds on a truncated TIFF; all mean "not whole yet"
        return False
    return True


def probe(path: Path, root: Path) -> bool:
    """Whether the file looks whole: its format's header and trailer, never a full parse. Blocking.

    Content no probe knows passes, so the renderer can report ``not_a_document``; a file too short
    to recognise does not, because a copy often starts that way. Opened as ``sourcefile`` opens (no
    link, only a regular file, non-blocking), so a FIFO or link swapped in since the last look is
    merely "not whole".
    """
    try:
        descriptor, signature = open_file(path, root)
        with os.fdopen(descriptor, "rb") as handle:
            if signature.size < MIN_SNIFF_BYTES:
                return False
            head = handle.read(HEAD_BYTES)
            kind = sniff(head)
            if kind == "tiff":
                return _tiff_complete(handle, signature.size)
            handle.seek(max(0, signature.size - TAIL_BYTES))
            return looks_complete(kind, head, handle.read(TAIL_BYTES), signature.size)
    except (OSError, SourceGone, NotARegularFile):
        return False
