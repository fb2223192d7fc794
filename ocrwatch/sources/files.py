"""The files named on the command line (``ocrwatch ocr FILE...``) as a source: no watching, no
settling.

A file named by the user is theirs to name through a link, so the name is followed; it is still
opened once (non-blocking, a regular file only) and copied through that descriptor while hashed, so
the bytes rendered are the bytes hashed even when the name is swapped meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from functools import partial
from pathlib import Path

from ocrwatch.config import DEFAULT_PRIORITY
from ocrwatch.errors import NotARegularFile, SourceGone
from ocrwatch.safefs import Access, Signature
from ocrwatch.sources.base import Fetched, Job, LocalFile, Outbox, Outcome, Read
from ocrwatch.sources.sourcefile import copy_out, spool_name


class GivenFiles:
    """A ``Source`` over a fixed list of files; ``ocrwatch ocr`` starts its jobs itself, from
    ``jobs()``."""

    name = "cli"

    def __init__(
        self, paths: list[Path], *, prompt: str = "markdown", priority: int = DEFAULT_PRIORITY
    ) -> None:
        self._paths = [Path(os.path.abspath(path)) for path in paths]
        self._prompt = prompt
        self._priority = priority

    def jobs(self) -> list[Job]:
        return [
            Job(
                origin=LocalFile(path, path.parent),
                source=self.name,
                priority=self._priority,
                prompt=self._prompt,
            )
            for path in self._paths
        ]

    async def start(self, outbox: Outbox) -> None:
        for job in self.jobs():
            await outbox.submit(job)

    async def stop(self) -> None:
        return None

    async def fetch(self, job: Job, spool_dir: Path, read: Read | None = None) -> Fetched:
        assert isinstance(job.origin, LocalFile)
        return await asyncio.to_thread(
            _fetch_named, job.origin.path, spool_dir, job.max_bytes, read
        )

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        return None


def open_named(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file the user named (links followed: theirs to name),
    opened once and non-blocking (a FIFO never blocks), and its ``fstat``: the one way ``ocr``
    opens a named file, to copy it or to ask whether it is done. The caller closes it. Raises
    ``SourceGone``, ``NotARegularFile`` or ``OSError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SourceGone(f"{path}: no such file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _fetch_named(
    path: Path, spool_dir: Path, max_bytes: int | None, read: Read | None = None
) -> Fetched:
    """Open ``path`` once (links followed: the user named it) and copy it into ``spool_dir`` while
    hashing (unless ``read`` holds: ``copy_out``)."""
    fd, info = open_named(path)
    try:
        target = spool_dir / spool_name(path)
        sha256, signature = copy_out(
            fd, path, target, sys.maxsize if max_bytes is None else max_bytes, read
        )
    finally:
        os.close(fd)
    access = Access.of(info)
    return Fetched(target, sha256, partial(_changed, path, signature), access)


def _changed(path: Path, before: Signature) -> bool:
    try:
        return not Signature.of(os.stat(path)).unchanged(before)
    except OSError:
        return True
