"""One job while this process holds it: its task, its slot, what it read, and its ledger calls.

As rq keeps a job's status on its ``Job``, a ``JobRun`` is the one home of that state, so the
pipeline keeps one table of runs; a run the ledger never hears of (``ocrwatch ocr``) says so once,
in ``Record``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ocrwatch.config import TextMode
from ocrwatch.pages.scheduler import Document
from ocrwatch.sources.base import Job, Read
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Fingerprint, State


@dataclass(frozen=True)
class Asked:
    """What ``ocrwatch ocr`` asks of a job instead of its inbox's settings; None keeps the
    inbox's."""

    lang: str | None = None
    text: TextMode | None = None


def read_of(fingerprint: Fingerprint) -> Read | None:
    """A local file's fingerprint as what was read of it (``Read``); None where it was not hashed
    (over its byte budget, an object) or its stat fields were not recorded."""
    then = fingerprint
    if then.sha256 is None or then.mtime_ns is None or then.inode is None or then.ctime_ns is None:
        return None
    return Read(then.sha256, then.size, then.mtime_ns, then.ctime_ns, then.inode)


class Record:
    """The ledger as one job sees it: its key bound, calls through ``AsyncLedger`` (in a thread:
    another process holding the database lock must not stall the loop), and none at all for a job
    the ledger never hears of."""

    def __init__(self, ledger: AsyncLedger | None, key: str) -> None:
        self._ledger = ledger
        self.key = key

    async def admit(self, job: Job, fingerprint: Fingerprint) -> None:
        if self._ledger is not None:
            await self._ledger.admit(job, fingerprint)

    async def set_state(self, state: State, **fields: int) -> None:
        if self._ledger is not None:
            await self._ledger.set_state(self.key, state, **fields)

    async def read(self) -> Read | None:
        """What admission read of the job's local file, from its ledger row: its sha256 and the stat
        fields it was hashed under. None where nothing is recorded, or nothing was hashed (a file
        over its byte budget, an object)."""
        if self._ledger is None:
            return None
        row = await self._ledger.known(self.key)
        return read_of(row.fingerprint) if row is not None else None

    async def record_attempt(self) -> int | None:
        """The attempts counted so far, this one included; None where nothing is recorded."""
        if self._ledger is None:
            return None
        return await self._ledger.record_attempt(self.key, None)

    async def release_attempt(self) -> None:
        if self._ledger is not None:
            await self._ledger.release_attempt(self.key)

    async def park(self, error: dict[str, Any]) -> int:
        """The attempts left counted once a fault of the place has given this one back."""
        if self._ledger is None:
            return 0
        return await self._ledger.park(self.key, error)

    async def mark_done(self) -> None:
        if self._ledger is not None:
            await self._ledger.mark_done(self.key)

    async def mark_failed(self, error: dict[str, Any]) -> None:
        if self._ledger is not None:
            await self._ledger.mark_failed(self.key, error)


@dataclass(eq=False)
class JobRun:
    """A job's run in this process, from its task's start to its end.

    ``asked`` is None for a job a source found (recorded in the ledger, started in a slot the
    dispatcher took for it: ``given`` until it enters it); ``ocrwatch ocr``'s jobs carry what it
    asked.
    """

    job: Job
    record: Record
    asked: Asked | None = None
    task: asyncio.Task[str] | None = None
    given: bool = False
    holding: bool = False  # in one of the ``max_active_documents`` slots now
    document: Document | None = None  # its pages in the scheduler, while they are recognised
    read: str | None = None  # sha256 of the bytes fetched, for an error sidecar
    lang: str | None = None  # the languages its pages are recognised in, once they are

    @property
    def recorded(self) -> bool:
        return self.asked is None
