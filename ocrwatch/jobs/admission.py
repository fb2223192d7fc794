"""Admission: whether a job runs at all, and when.

``submit`` is where every source's job comes in, and it returns its answer (``sources.base.Answer``)
rather than calling the source back. The ledger and the sidecars decide whether it runs: a job whose
sidecars already describe its content is done without a run, one the ledger holds as done or failed
with the same content is not run again, and the source is told so in the answer. A job that must
run is recorded ``queued`` and waits **in the ledger**, not in memory: ``waiting_jobs`` takes a
document slot, reads the next waiting row (higher priority first, then the oldest) and hands the job
to the pipeline, again each time a slot frees. So a backlog of a hundred thousand files costs rows
on disk rather than tasks, a stop leaves them where they are (one line says how many), and a start
resumes them in the same order, jobs interrupted mid-stage included.

A local file is fingerprinted before anything else, within its byte budget: its size comes from the
descriptor, and a file over its ``max_bytes`` is never read (it fails ``file_too_large`` when its
run fetches it), so a sparse file of terabytes costs a ``stat``. The files that are hashed are
hashed in a pool of ``HASHING_THREADS`` threads of its own (``Fingerprinter``), which a stop
interrupts between two blocks, and which says when it is stuck (``/readyz``). That hash is the
document's one: its run copies the file without hashing it again while the file is as it was
hashed (``sources.base.Read``, from the ledger's fingerprint).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from ocrwatch.config import LimitsConfig
from ocrwatch.errors import OcrwatchError, classify
from ocrwatch.jobs.archive import Archiver
from ocrwatch.jobs.hooks import HookRunner
from ocrwatch.jobs.jobrun import read_of
from ocrwatch.jobs.quarantine import quarantine
from ocrwatch.pages.renderspec import Limits
from ocrwatch.safefs import Stopped
from ocrwatch.sinks.base import Sink, done
from ocrwatch.sources.base import ADMITTED, Answer, Job, S3Object, Source, key_id
from ocrwatch.sources.sourcefile import inspect, measure
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Fingerprint, State

log = structlog.get_logger()

T = TypeVar("T")

Offload = Callable[..., Awaitable[Any]]
"""``offload(job, fn, *args)``: a blocking call about ``job``'s sidecars, in the threads of its
source."""

LEDGER_RETRY_SECONDS = 1.0
"""Pause before the next waiting job is read again after the ledger failed to say which it is."""
ADMITTING = 16
"""Jobs of one source admitted at once: a burst of files waits for its turn here, not in the default
thread pool's queue, where the ledger calls of the documents running meanwhile would wait behind
every one of them. Per source, so a bucket that does not answer holds back only its own jobs, never
an inbox's."""
LEFT_COUNT_SECONDS = 5.0
"""How long a stop waits for the ledger to count the jobs it leaves, for its one line about them."""
COUNT_SECONDS = 5.0
"""How often at most the dispatcher counts the backlog for the gauges (a scan of the index: ~0.1 s a
100,000)."""
HASHING_THREADS = 2
"""Threads that read new local files for their sha256, shared by every inbox. Each hash is bounded
by its file's ``max_bytes`` and is CPU work (hashlib releases the GIL): two keep a disk busy and
leave the other cores to rendering. A burst of files waits its turn here, so the ledger's calls and
``ocrwatch status``, in the default pool, never wait behind it."""


class Fingerprinter:
    """Runs fingerprints in ``threads`` threads of its own, and says how long it has been stuck: how
    long some have waited while none came out. ``stop`` ends those waiting at once and those being
    hashed before their next block (``Stopped``), so a stop never waits for a file."""

    def __init__(self, threads: int = HASHING_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ocrwatch-hash")
        self.stopping = threading.Event()  # ``hash_fd``'s ``stop``
        self._lock = threading.Lock()
        # each call not yet returned: whether a thread has taken it
        self._waiting: dict[object, bool] = {}
        self._moved = time.monotonic()  # when the last call returned, or the first of a burst came

    async def pooled(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the threads, with the caller's context (its log lines keep the
        job's id)."""
        if self.stopping.is_set():
            raise Stopped("the daemon is stopping")
        call = object()
        with self._lock:
            if not self._waiting:
                self._moved = time.monotonic()
            self._waiting[call] = False
        work = functools.partial(contextvars.copy_context().run, self._take, call, fn, *args)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, work)
        finally:
            with self._lock:
                if not self._waiting.get(call, False):  # done, or cancelled before a thread took it
                    self._waiting.pop(call, None)

    def _take(self, call: object, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if call not in self._waiting or self.stopping.is_set():
                raise Stopped("its caller no longer waits, or the daemon is stopping")
            self._waiting[call] = True
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._waiting.pop(call, None)
                self._moved = time.monotonic()

    def stalled(self) -> tuple[float, int]:
        """How long calls have waited with none returning (0.0: none waits), and how many wait."""
        with self._lock:
            waiting = len(self._waiting)
            return (time.monotonic() - self._moved if waiting else 0.0), waiting

    def stop(self) -> None:
        """End every call, waiting or running (each raises ``Stopped`` in its thread, so its caller
        hears why); none is taken after."""
        self.stopping.set()
        self._pool.shutdown(wait=False)


def job_id(job: Job) -> str:
    """A short stable id for logs and temporary folders (``key_id``)."""
    return key_id(job.key)


class Admission:
    """The way in, and the queue in the ledger behind it. Blocking calls run in threads (``offload``
    for the sinks', ``AsyncLedger`` for the ledger's)."""

    def __init__(
        self,
        ledger: AsyncLedger | None,
        sources: dict[str, Source],
        sinks: dict[str, Sink],
        archive: Archiver,
        hooks: HookRunner,
        offload: Offload,
        limits: LimitsConfig | None = None,
    ) -> None:
        """``limits``: the ``[limits]`` a job's inbox does not override (its byte budget)."""
        self.ledger = ledger
        self.sources = sources
        self.sinks = sinks
        self.archive = archive
        self.hooks = hooks
        self._offload = offload
        self.limits = limits or LimitsConfig()
        self.hashing = Fingerprinter()
        self._wanted = asyncio.Event()  # the ledger may hold a job to start
        self._admitting: dict[str, asyncio.Semaphore] = {}  # per source
        self.backlog = 0  # jobs waiting in the ledger, as last counted (the gauges read it)
        self.oldest: float | None = None  # when the oldest of them was admitted
        self._counted = -COUNT_SECONDS  # monotonic time of that count
        self._during: dict[str, Job] = {}  # submitted again while their run went on
        self._again: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        """A job may wait in the ledger now (admitted, put back by ``ocrwatch retry``, or a slot
        freed)."""
        self._wanted.set()

    async def submit(self, job: Job) -> Answer:
        """Admit a job (idempotent); returns once it is durably in the ledger, or known settled with
        nothing to run: its answer, for its source to act on."""
        admitting = self._admitting.setdefault(job.source, asyncio.Semaphore(ADMITTING))
        async with admitting:
            return await self._admit(job)

    async def _admit(self, job: Job) -> Answer:
        if isinstance(job.origin, S3Object):
            fingerprint = self.fingerprint(job)  # what the event said: nothing is read
        else:
            fingerprint = await self.hashing.pooled(self.fingerprint, job)
        if fingerprint is None:
            # Not there to read at this moment (gone, or a folder on its path swapped meanwhile):
            # the source must look again, not hold it as handed over.
            return Answer("retry")
        if await self.done_already(job, fingerprint):
            return Answer("done")
        ledger = self.ledger
        if ledger is not None and not await ledger.admit(job, fingerprint):
            row = await ledger.known(job.key)
            if row is None:
                return ADMITTED
            if row.state not in ("done", "failed"):
                # Mid-run: what the run ends with may not hold for the file as it is now (a run
                # that fails ``source_changed`` saw a swap this event may come after).
                self._during[job.key] = job
                return ADMITTED
            written = row.state == "done" and await self._offload(
                job, self.already_written, job, fingerprint
            )
            if row.state == "failed" or written:
                return Answer(row.state, (row.last_error or {}).get("kind"))
            # Done with this very content, yet no sidecar records it (deleted, or another's now):
            # done again.
            log.info("job_sidecars_missing", job_id=job_id(job), uri=job.origin.uri)
            await ledger.set_state(job.key, "queued")
            # The next run's attempt replaces the finished run's.
            await ledger.release_attempt(job.key)
        self.wake()
        return ADMITTED

    def ended(self, key: str) -> None:
        """A run ended: a job submitted again while it went on is admitted once more, so the file as
        it is now is judged on its own, not by the outcome of a run that read what it was."""
        job = self._during.pop(key, None)
        if job is not None:
            task = asyncio.create_task(self._admit_again(job), name=f"admit:{job_id(job)}")
            self._again.add(task)
            task.add_done_callback(self._again.discard)

    async def _admit_again(self, job: Job) -> None:
        """Admitted once more, after the source's own ``submit`` returned: an answer that settles
        the job is told to its source, as a run's outcome is."""
        try:
            answer = await self.submit(job)
            if answer.final:
                asked = await self.sources[job.source].finish(job, answer.settled, answer.kind)
                if asked is not None:  # its source sets it aside
                    await quarantine(asked, self.archive.written)
        except Exception as exc:  # the next scan or event admits it
            error = classify(exc)
            log.error(
                "job_admit_failed",
                job_id=job_id(job),
                uri=job.origin.uri,
                kind=error.kind,
                error=error.message,
            )

    def fingerprint(self, job: Job) -> Fingerprint | None:
        """The job's content as the ledger compares it (blocking); None when a local file is
        gone. A local file over its ``max_bytes`` is never read: its signature stands for it (no
        sha256), so it is run once, fails ``file_too_large`` from its size, and is run again only
        once that signature changes. ``Stopped`` once ``hashing`` is stopped."""
        origin = job.origin
        if isinstance(origin, S3Object):
            return Fingerprint(
                size=origin.size or 0,
                mtime_ns=None,
                sha256=None,
                etag=origin.etag,
                version_id=origin.version_id,
            )
        # Beneath the inbox, no link followed: nothing outside it is ever hashed into the ledger.
        try:
            signature = inspect(origin.path, origin.inbox)
            if self.ledger is not None:
                row = self.ledger.blocking.known(job.key)
                ended = row is not None and row.state in ("done", "failed")
                then = row.fingerprint if row is not None and ended else None
                if then is not None and signature.unchanged(then.stat(signature.device)):
                    return then  # unchanged since its run ended: no need to read it again
            budget = Limits.for_job(self.limits, job).max_bytes
            signature, digest = measure(origin.path, origin.inbox, budget, self.hashing.stopping)
        except (OcrwatchError, OSError):  # gone, or no longer a regular file: nothing to admit
            return None
        return Fingerprint(
            size=signature.size,
            mtime_ns=signature.mtime_ns,
            sha256=digest,
            inode=signature.inode,
            ctime_ns=signature.ctime_ns,
        )

    def stuck(self, bound: float) -> str | None:
        """Why admission is stuck (``/readyz``), or None: files have waited ``bound`` seconds
        (``[daemon] admission_stall_seconds``) for their fingerprint with none coming out. The
        default, 120 s, is twice what a file at the default budget (512 MiB) takes from a share
        read at 10 MB/s: a filesystem that hangs, not a slow file."""
        stalled, waiting = self.hashing.stalled()
        if not waiting or stalled < bound:
            return None
        return f"no file fingerprinted for {stalled:.0f} s while {waiting} wait"

    def stop(self) -> None:
        """At a stop: every fingerprint ends now (the next start's scan submits those files
        again)."""
        self.hashing.stop()

    def already_written(self, job: Job, fingerprint: Fingerprint) -> bool:
        """``sinks.base.done`` through the job's own sink (blocking)."""
        return done(self.sinks[job.source], job, fingerprint)

    def lapsed(self, job: Job) -> bool:
        """Whether a job the ledger holds as done has lost its sidecars since (deleted, or not its
        own now): its source submits it again. Blocking."""
        row = self.ledger.blocking.known(job.key) if self.ledger is not None else None
        return (
            row is not None
            and row.state == "done"
            and not self.already_written(job, row.fingerprint)
        )

    async def lapsed_of(self, jobs: list[Job]) -> list[Job]:
        """Those of ``jobs`` that ``lapsed`` (a source's question, ``Outbox.lapsed``), asked in one
        worker thread for them all."""
        return await asyncio.to_thread(lambda: [job for job in jobs if self.lapsed(job)])

    async def done_already(self, job: Job, fingerprint: Fingerprint) -> bool:
        """A job whose sidecars describe its content is done without a run: recorded so, and its
        source acted upon (moved, deleted) as on success. The caller tells the source."""
        if not await self._offload(job, self.already_written, job, fingerprint):
            return False
        if self.ledger is not None:
            await self.ledger.admit(job, fingerprint)
            await self.ledger.mark_done(job.key)
        # Debug: a restart finds every file done before, and the local source says how many in
        # one line an inbox.
        log.debug("job_already_done", job_id=job_id(job), uri=job.origin.uri)
        moved = await self._offload(
            job,
            self.archive.apply_on_success,
            job,
            None,
            fingerprint.sha256,
            None,
            read_of(fingerprint),
        )
        await self.hooks.relocate(job.key, moved)
        return True

    async def resume(self, running: Collection[str]) -> int:
        """At start (and after ``ocrwatch retry``): a job a killed process left ``writing`` whose
        sidecars were written is only marked done (before the hooks settle what that process held);
        the rest wait for ``waiting_jobs``. How many unfinished jobs of the configured sources
        wait."""
        ledger = self.ledger
        assert ledger is not None
        writing: tuple[State, ...] = ("writing",)
        for row in await ledger.unfinished(writing):
            if row.key in running or row.job.source not in self.sinks:
                continue
            if await self._offload(row.job, self.already_written, row.job, row.fingerprint):
                await ledger.mark_done(row.key)
        await self.count(running)
        self.wake()
        return self.backlog

    async def count(self, running: Collection[str]) -> int:
        """Count the jobs waiting in the ledger (``backlog``, ``oldest``); how many."""
        if self.ledger is not None:
            self.backlog, self.oldest = await self.ledger.backlog(list(self.sources), list(running))
            self._counted = time.monotonic()
        return self.backlog

    async def say_left(self) -> None:
        """At a stop, once nothing runs: one line for the jobs left waiting in the ledger, however
        many (each starts at the next start)."""
        if self.ledger is None:
            return
        try:
            left = await asyncio.wait_for(self.count(()), LEFT_COUNT_SECONDS)
        except Exception as exc:  # never holds the stop up: the jobs wait in the ledger anyway
            log.warning("jobs_left_uncounted", kind=classify(exc).kind, error=str(exc))
            return
        if left:
            log.info("jobs_left_queued", jobs=left, hint="in the ledger, for the next start")

    async def waiting_by(
        self, place: Callable[[Job], str], running: Collection[str]
    ) -> Counter[str]:
        """The jobs waiting in the ledger, counted by ``place`` (``ocrwatch status``)."""
        if self.ledger is None:
            return Counter()
        return await self.ledger.waiting_by(list(self.sources), list(running), place)

    async def waiting_jobs(
        self, slots: asyncio.Semaphore, running: Collection[str], held: int
    ) -> AsyncIterator[Job]:
        """Until cancelled: whenever a slot is free and fewer than ``held`` recorded jobs are in
        memory (``running``, the keys of those the pipeline holds, a live view; those in a backoff
        hold no slot, and must not pile up while a fault of the place lasts), the next waiting job
        is read from the ledger and yielded, to be started in that slot before the next is asked
        for."""
        ledger = self.ledger
        assert ledger is not None
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            while len(running) < held:
                await slots.acquire()
                try:
                    rows = await ledger.waiting(1, list(self.sources), list(running))
                except asyncio.CancelledError:
                    slots.release()
                    raise
                except Exception as exc:
                    slots.release()
                    error = classify(exc)
                    log.error(
                        "ledger_queue_unreadable",
                        kind=error.kind,
                        error=error.message,
                        hint=error.hint,
                    )
                    await asyncio.sleep(LEDGER_RETRY_SECONDS)
                    self.wake()
                    break
                if not rows:
                    slots.release()
                    self.backlog, self.oldest = 0, None
                    break
                yield rows[0].job
                if time.monotonic() - self._counted >= COUNT_SECONDS:
                    await self.count(running)
