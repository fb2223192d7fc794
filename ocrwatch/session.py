"""``DocumentSession``: everything one document allocates, released on every way out.

Success, failure, cancellation and shutdown all leave through ``__aexit__``, which cancels the document's
pages in the scheduler (aborting their engine requests), deletes its private temporary folder (spooled
downloads, rendered files), drops its images, asks the engine to ``release()`` what it can and hands the
C heap's free memory back to the system (``malloc_trim``, at most every ``TRIM_INTERVAL_SECONDS``). This is
what keeps memory flat over tens of thousands of documents.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import structlog

from ocrwatch.engines.base import Engine

if TYPE_CHECKING:
    from ocrwatch.scheduler import Document, PageScheduler

log = structlog.get_logger()


def _find_malloc_trim() -> ctypes._CFuncPtr | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_MALLOC_TRIM = _find_malloc_trim()


def trim_heap() -> None:
    """glibc may keep freed memory in its arenas instead of returning it: on the H200 the daemon's RSS grew
    from 2.4 to 13.2 GiB over 636 pages and stayed there with nothing in flight (bench/README.md, run 3)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


TRIM_INTERVAL_SECONDS = 10.0


class HeapTrimmer:
    """``trim_heap`` at most once per ``interval`` seconds, and never twice at once: malloc_trim walks every
    arena under its lock (22 ms with nothing to return, 359 ms after 1.3 GB was freed, on the dev machine), so
    a wave of documents finishing together must not queue one trim each behind the event loop's allocations."""

    def __init__(self, interval: float = TRIM_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last = -float("inf")
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        """Trim if the last trim is ``interval`` old; whether this call trimmed."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            now = self._clock()
            if now - self._last < self.interval:
                return False
            self._last = now
            trim_heap()
            return True
        finally:
            self._lock.release()


_TRIMMER = HeapTrimmer()


class DocumentSession:
    def __init__(self, job_id: str, tmp_root: Path, engine: Engine, scheduler: PageScheduler | None = None) -> None:
        self.job_id = job_id
        self._tmp_root = tmp_root
        self._engine = engine
        self._scheduler = scheduler
        self.spool_dir: Path | None = None
        self.document: Document | None = None

    async def __aenter__(self) -> DocumentSession:
        self._tmp_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.spool_dir = Path(tempfile.mkdtemp(prefix=f"job-{self.job_id[:12]}-", dir=self._tmp_root))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        aborted: list[str] = []
        if self.document is not None and self._scheduler is not None:
            aborted = await self._scheduler.cancel(self.document)
            for request_id in aborted:
                await self._engine.abort(request_id)
        self.document = None
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            self.spool_dir = None
        self._engine.release()
        await asyncio.to_thread(_TRIMMER)
        if aborted:
            log.info("session_aborted_requests", job_id=self.job_id, requests=len(aborted))
