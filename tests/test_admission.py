"""``Admission.dispatch`` and ``resume`` against a real ledger: waiting jobs stay rows in the ledger
and come out one per free slot, best first; jobs waiting out a backoff (no slot) are bounded; a job
a killed process left ``writing`` whose sidecars were written is only marked done. Byte budgets: a
file over its ``max_bytes`` is admitted by its signature without a byte read, and hashing runs in a
pool of its own that a stop interrupts and that says when admission is stuck."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any, cast

import pytest

from ocrwatch.errors import CorruptPdf, FileTooLarge
from ocrwatch.jobs.admission import HASHING_THREADS, Admission
from ocrwatch.jobs.archive import Archiver
from ocrwatch.jobs.hooks import HookRunner
from ocrwatch.safefs import Stopped
from ocrwatch.sinks.base import Sink
from ocrwatch.sources.base import Job, LocalFile, Source
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Fingerprint, Ledger
from tests.support.sparse import TIB, Reads, sparse_file

FP = Fingerprint(size=3, mtime_ns=1, sha256="ab" * 32)


class Runner:
    """What the pipeline is to ``waiting_jobs``: it starts the jobs yielded and holds them until a
    test lets them go."""

    def __init__(self) -> None:
        self.held: dict[str, Job] = {}
        self.started: list[str] = []

    def running(self) -> Collection[str]:
        return self.held.keys()

    def start_job(self, job: Job) -> None:
        self.held[job.key] = job
        self.started.append(job.key)

    async def dispatch(self, made: Admission, slots: asyncio.Semaphore, held: int) -> None:
        """As ``Pipeline._dispatch``: each job yielded is started before the next is asked for."""
        async for waiting in made.waiting_jobs(slots, self.running(), held):
            self.start_job(waiting)


class RecordedSink:
    """Says the sidecars of ``written`` record ``FP``."""

    def __init__(self, written: set[str]) -> None:
        self.written = written

    def recorded(self, job: Job) -> dict[str, Any] | None:
        return {"bytes": FP.size, "sha256": FP.sha256} if job.key in self.written else None


async def inline(job: Job, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Told:
    """A source that keeps what ``finish`` told it."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str | None]] = []

    async def finish(self, job: Job, outcome: str, kind: str | None = None) -> None:
        self.told.append((job.key, outcome, kind))


async def submitted(made: Admission, job: Job) -> None:
    """``submit``, its answer acted on as a source acts on it: one that settles the job with nothing
    run is told to the source's ``finish``."""
    answer = await made.submit(job)
    if answer.final:
        await made.sources[job.source].finish(job, answer.settled, answer.kind)


def admission(
    ledger: Ledger, sink: RecordedSink | None = None, source: Told | None = None
) -> Admission:
    sources = {"inbox": cast(Source, source)}
    sinks = {"inbox": cast(Sink, sink or RecordedSink(set()))}
    return Admission(
        AsyncLedger(ledger), sources, sinks, cast(Archiver, None), cast(HookRunner, None), inline
    )


def job(tmp_path: Path, name: str, priority: int = 50) -> Job:
    inbox = tmp_path / "inbox"
    return Job(origin=LocalFile(path=inbox / name, inbox=inbox), source="inbox", priority=priority)


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    for _ in range(400):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def settled() -> None:
    """Long enough for the dispatcher to read the ledger had it anything to read."""
    for _ in range(20):
        await asyncio.sleep(0.01)


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as opened:
        yield opened


@pytest.fixture
async def dispatching() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_waiting_jobs_start_one_per_free_slot_best_first(
    tmp_path: Path, ledger: Ledger, dispatching: list[asyncio.Task[None]]
) -> None:
    backlog = [job(tmp_path, f"page-{n:04d}.png") for n in range(1000)]
    urgent = job(tmp_path, "urgent.png", priority=90)
    for waiting in (*backlog, urgent):
        assert ledger.admit(waiting, FP)
    made, runner, slots = admission(ledger), Runner(), asyncio.Semaphore(4)
    dispatching.append(asyncio.create_task(runner.dispatch(made, slots, 8)))
    made.wake()
    await eventually(lambda: len(runner.started) == 4, "four jobs in the four slots")
    assert runner.started == [urgent.key, *(j.key for j in backlog[:3])]
    await settled()
    assert len(runner.started) == 4  # the other 997 are rows, not tasks

    ledger.mark_done(urgent.key)  # it ended: its row finished, its slot given back
    del runner.held[urgent.key]
    slots.release()
    made.wake()
    await eventually(lambda: len(runner.started) == 5, "the next job in the freed slot")
    assert runner.started[-1] == backlog[3].key

    for _ in range(4):  # the four in slots wait out a backoff: no slot, still held
        slots.release()
    await eventually(lambda: len(runner.held) == 8, "jobs in the slots the backoffs freed")
    slots.release()  # one more of them waits out a backoff
    made.wake()
    await settled()
    assert len(runner.held) == 8 and not slots.locked()  # the bound: no more, though a slot is free
    assert await made.count(runner.running()) == 1001 - 1 - 8


async def test_a_job_left_writing_with_its_sidecars_written_is_only_marked_done(
    tmp_path: Path, ledger: Ledger
) -> None:
    written, unwritten, queued = (job(tmp_path, name) for name in ("done.png", "lost.png", "q.png"))
    for each in (written, unwritten, queued):
        ledger.admit(each, FP)
    ledger.set_state(written.key, "writing")
    ledger.set_state(unwritten.key, "writing")
    made = admission(ledger, RecordedSink({written.key}))
    assert await made.resume(()) == 2
    states = [ledger.known(each.key).state for each in (written, unwritten, queued)]
    assert states == ["done", "writing", "queued"]


async def test_a_file_seen_again_while_its_run_failed_source_changed_is_admitted_when_the_run_ends(
    tmp_path: Path, ledger: Ledger
) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "swapped.png").write_bytes(b"png")
    seen = job(tmp_path, "swapped.png")
    made = admission(ledger)
    await submitted(made, seen)
    ledger.set_state(seen.key, "recognizing")
    await submitted(made, seen)  # an event while the run goes on: the file is back as it was
    ledger.mark_failed(seen.key, {"kind": "source_changed", "message": "swapped mid-run"})
    made.ended(seen.key)
    await eventually(lambda: ledger.known(seen.key).state == "queued", "the file admitted again")
    ledger.mark_done(seen.key)
    made.ended(seen.key)  # once: a run that ends with no event during it admits nothing again
    await settled()
    assert ledger.known(seen.key).state == "done"


async def test_a_file_not_there_to_read_when_submitted_is_handed_back_to_its_source(
    tmp_path: Path, ledger: Ledger
) -> None:
    """Its folder swapped for a link at that moment, or the file gone: nothing is admitted, and the
    source is answered ``retry`` by ``submit`` itself, so it never holds the file as handed over
    (no scan would look at it again, and it would end with no outcome)."""
    inbox, vault = tmp_path / "inbox", tmp_path / "vault"
    inbox.mkdir()
    (vault / "folder").mkdir(parents=True)
    (vault / "folder" / "doc.png").write_bytes(b"png")
    (inbox / "folder").symlink_to(vault / "folder")
    told = Told()
    made = admission(ledger, source=told)
    swapped = Job(origin=LocalFile(inbox / "folder" / "doc.png", inbox), source="inbox")
    gone = job(tmp_path, "gone.png")
    for each in (swapped, gone):
        await submitted(made, each)
    assert told.told == [(swapped.key, "retry", None), (gone.key, "retry", None)]
    assert ledger.known(swapped.key) is None and ledger.known(gone.key) is None

    (inbox / "folder").unlink()  # whole at its path again: admitted as any file
    (vault / "folder").rename(inbox / "folder")
    await submitted(made, swapped)
    assert ledger.known(swapped.key).state == "queued" and len(told.told) == 2


# --- byte budgets ---------------------------------------------------------------------------------


async def test_a_file_over_its_budget_is_admitted_by_its_signature_without_a_byte_read(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sparse 2 TiB PDF in an inbox whose ``max_bytes`` is 1 MiB: queued (its run fails
    ``file_too_large``) with its signature for a fingerprint, not run again while it is unchanged,
    and run again once a file of the same size and mtime replaces it."""
    reads = Reads(monkeypatch)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    huge = reads.watch(sparse_file(inbox / "huge.pdf", 2 * TIB))
    over = Job(origin=LocalFile(huge, inbox), source="inbox", max_bytes=1 << 20)
    told = Told()
    made = admission(ledger, source=told)
    await submitted(made, over)
    info = os.stat(huge)
    row = ledger.known(over.key)
    assert row is not None and row.state == "queued"
    assert row.fingerprint == Fingerprint(
        size=2 * TIB,
        mtime_ns=info.st_mtime_ns,
        sha256=None,
        inode=info.st_ino,
        ctime_ns=info.st_ctime_ns,
    )

    ledger.mark_failed(over.key, FileTooLarge(f"{huge}: too large").as_dict())
    await submitted(made, over)  # a scan or a restart: unchanged, so not run again
    assert ledger.known(over.key).state == "failed"
    assert told.told == [(over.key, "failed", "file_too_large")]

    other = reads.watch(sparse_file(inbox / ".other.pdf", 2 * TIB, tail=b"other\n%%EOF\n"))
    os.utime(other, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.rename(other, huge)
    await submitted(made, over)
    assert ledger.known(over.key).state == "queued", "a replacement is run again"
    assert reads.bytes == 0


async def test_a_file_whose_run_ended_is_not_read_again_while_unchanged(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Done or failed, a file is judged by its signature at the next scan or start: a restart among
    many large failed documents reads none of them."""
    reads = Reads(monkeypatch)
    (tmp_path / "inbox").mkdir()
    reads.watch(sparse_file(tmp_path / "inbox" / "doc.pdf", 8 << 20))
    seen, told = job(tmp_path, "doc.pdf"), Told()
    made = admission(ledger, source=told)
    await submitted(made, seen)
    assert reads.bytes == 8 << 20
    ledger.mark_failed(seen.key, CorruptPdf("no trailer").as_dict())
    await submitted(made, seen)
    assert reads.bytes == 8 << 20 and told.told == [(seen.key, "failed", "corrupt_pdf")]


async def test_files_are_hashed_in_a_pool_of_their_own_that_a_stop_interrupts(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four sparse terabytes within their budget: two threads of the pool hash them (the default
    pool stays free for the ledger), admission says it is stuck once none comes out, and a stop ends
    every hash, running or waiting, at once."""
    reads = Reads(monkeypatch, cap=16 << 30)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    jobs = [
        Job(
            origin=LocalFile(reads.watch(sparse_file(inbox / f"big{n}.pdf", TIB)), inbox),
            source="inbox",
            max_bytes=2 * TIB,
        )
        for n in range(4)
    ]
    made = admission(ledger, source=Told())
    assert made.stuck(0.2) is None
    submits = [asyncio.create_task(made.submit(each)) for each in jobs]
    await eventually(lambda: made.stuck(0.2), "admission to say it is stuck")
    assert "while 4 wait" in (made.stuck(0.2) or "")
    assert await asyncio.to_thread(ledger.summary)  # the default pool answers meanwhile
    made.stop()
    outcomes = await asyncio.gather(*submits, return_exceptions=True)
    assert all(isinstance(outcome, Stopped) for outcome in outcomes), outcomes
    assert len(reads.threads) == HASHING_THREADS, reads.threads
    assert all(name.startswith("ocrwatch-hash") for name in reads.threads), reads.threads
    assert made.stuck(0.0) is None, "none waits"
    assert all(ledger.known(each.key) is None for each in jobs), "none admitted"
