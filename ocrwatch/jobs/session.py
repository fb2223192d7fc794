"""``DocumentSession``: everything one document allocates, released on every way out.

Success, failure, cancellation and shutdown all leave through ``__aexit__``, which cancels the
document's pages in the scheduler (aborting their engine requests), deletes its private temporary
folder (spooled downloads, rendered files), drops its images, asks the engine to ``release()`` what
it can and hands the C heap's free memory back to the system (``memory.HeapTrimmer``:
``malloc_trim``, at most every ``memory.TRIM_INTERVAL_SECONDS``). This is what keeps memory flat
over tens of thousands of documents.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import structlog

from ocrwatch.engines.base import Engine
from ocrwatch.infra.memory import HeapTrimmer

if TYPE_CHECKING:
    from ocrwatch.pages.scheduler import Document, PageScheduler

log = structlog.get_logger()
_TRIMMER = HeapTrimmer()  # one for every session: documents finishing together trim once


class DocumentSession:
    """One document's resources; ``async with`` guarantees they are released however the document
    ends."""

    def __init__(
        self, job_id: str, tmp_root: Path, engine: Engine, scheduler: PageScheduler | None = None
    ) -> None:
        self.job_id = job_id
        self._tmp_root = tmp_root
        self._engine = engine
        self._scheduler = scheduler
        self.spool_dir: Path | None = None
        self.document: Document | None = None

    async def __aenter__(self) -> DocumentSession:
        self._tmp_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.spool_dir = Path(
            tempfile.mkdtemp(prefix=f"job-{self.job_id[:12]}-", dir=self._tmp_root)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
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
