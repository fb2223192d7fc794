"""A job's ledger calls through ``Record``: each lands in a real ledger, and none is made for a job
the ledger never hears of (``ocrwatch ocr``), which used to be a string lookup that skipped
silently."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ocrwatch.jobs.jobrun import Asked, JobRun, Record
from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Fingerprint, Ledger


def _job(tmp_path: Path) -> Job:
    return Job(
        origin=LocalFile(path=tmp_path / "in" / "a.pdf", inbox=tmp_path / "in"), source="local"
    )


def test_a_recorded_run_moves_its_row_through_the_states(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with Ledger(tmp_path / "state" / "ledger.db") as ledger:

        async def scenario() -> None:
            record = Record(AsyncLedger(ledger), job.key)
            await record.admit(job, Fingerprint(size=3, mtime_ns=1, sha256="ab" * 32))
            assert await record.record_attempt() == 1
            await record.set_state("recognizing", pages_total=2)
            row = ledger.known(job.key)
            assert row is not None and (row.state, row.pages_total) == ("recognizing", 2)
            assert await record.park({"kind": "disk_full", "message": "m"}) == 0
            assert await record.record_attempt() == 1  # the parked attempt was given back
            await record.mark_failed({"kind": "corrupt_pdf", "message": "bad"})
            row = ledger.known(job.key)
            assert row is not None and row.state == "failed"
            assert (row.last_error or {}).get("kind") == "corrupt_pdf"

        asyncio.run(scenario())


def test_a_run_that_asked_is_never_recorded(tmp_path: Path) -> None:
    job = _job(tmp_path)
    run = JobRun(job, Record(None, job.key), Asked(lang="deu"))
    assert not run.recorded and JobRun(job, Record(None, job.key)).recorded

    async def scenario() -> None:
        await run.record.admit(job, Fingerprint(size=3, mtime_ns=1, sha256="ab" * 32))
        assert await run.record.record_attempt() is None
        assert await run.record.park({"kind": "disk_full", "message": "m"}) == 0
        await run.record.set_state("writing")
        await run.record.mark_done()

    asyncio.run(scenario())
