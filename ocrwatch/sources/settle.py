"""What settling looks at: which regular file a name stands for, and whether that file is whole yet.

Both are blocking and cheap (an ``lstat``, a header and a trailer, never a full parse), and both refuse to
open anything that is not a regular file, so a FIFO dropped in an inbox cannot hang a worker thread. The
format comes from ``ocrwatch.sniff``, the renderer's own sniffer, so a file is waited on as the format it will
be rendered as.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from PIL import Image

from ocrwatch.errors import NotARegularFile, SourceGone
from ocrwatch.sniff import HEAD_BYTES, sniff

Signature = tuple[int, int]
"""(size, mtime_ns): what "unchanged" means for a file."""

TAIL_BYTES = 2048
MIN_SNIFF_BYTES = 12


def inspect_file(path: Path, root: Path) -> tuple[Path, Signature]:
    """The regular file ``path`` stands for, and its signature. Blocking; opens nothing.

    A symlink stands for its target when that stays inside ``root`` (the resolved inbox). Raises
    ``SourceGone`` when nothing is there and ``NotARegularFile`` for anything else.
    """
    if not path.is_relative_to(root):
        raise NotARegularFile(f"{path}: outside the inbox {root}")
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            real = path.resolve(strict=True)
            if not real.is_relative_to(root):
                raise NotARegularFile(f"{path}: a symlink that leads outside the inbox, to {real}")
            path, info = real, os.stat(real)
    except FileNotFoundError:
        raise SourceGone(f"{path}: no longer exists") from None
    except RuntimeError:  # a symlink loop, before Python 3.13
        raise NotARegularFile(f"{path}: a symlink loop") from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise NotARegularFile(f"{path}: a symlink loop") from None
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(f"{path}: not a regular file")
    return path, (info.st_size, info.st_mtime_ns)


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
                tags = image.tag_v2
                offsets, counts = tags.get(273) or tags.get(324) or (), tags.get(279) or tags.get(325) or ()
                if isinstance(offsets, int):
                    offsets, counts = (offsets,), (counts,)
                if any(offset + length > size for offset, length in zip(offsets, counts)):
                    return False
    except Exception:  # Pillow raises many kinds on a truncated TIFF; all mean "not whole yet"
        return False
    return True


def probe(path: Path) -> bool:
    """Whether the file looks whole: its format's header and trailer, never a full parse. Blocking.

    Content no probe knows passes, so the renderer can report ``not_a_document``; a file too short to
    recognise does not, because a copy often starts that way. Opened non-blocking and checked again with
    ``fstat``, so a FIFO swapped in since the last look cannot hang the thread.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size < MIN_SNIFF_BYTES:
                return False
            head = handle.read(HEAD_BYTES)
            kind = sniff(head)
            if kind == "tiff":
                return _tiff_complete(handle, info.st_size)
            handle.seek(max(0, info.st_size - TAIL_BYTES))
            return looks_complete(kind, head, handle.read(TAIL_BYTES), info.st_size)
    except OSError:
        return False
