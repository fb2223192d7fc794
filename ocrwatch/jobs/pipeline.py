"""A document's way from its source to its sidecars, one named step after another.

``Pipeline._process`` reads like the recipe it is: fetch and probe, render and recognise (the
shared scheduler asks for pages to be rendered ahead and recognised; ``recognition`` answers both),
assemble, write; the steps that need no pipeline state are ``steps``. Around it sit admission
(``admission``: whether a job runs at all, and when: jobs wait in the ledger until a slot
frees), the retry loop (a transient failure is tried again with backoff) and ``reject``, the one
place where a job is given up and its error sidecar written, whether the pipeline failed it or its
source did.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import structlog

from ocrwatch.config import Config
from ocrwatch.errors import (
    CrashLoop,
    OcrwatchError,
    PermanentError,
    SourceChanged,
    SourceGone,
    classify,
)
from ocrwatch.infra import children
from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.infra.metrics import Metrics
from ocrwatch.jobs import steps
from ocrwatch.jobs.admission import Admission, job_id
from ocrwatch.jobs.archive import Archiver
from ocrwatch.jobs.attempts import attempts_of_a_job, is_place_fault
from ocrwatch.jobs.hooks import HookRunner
from ocrwatch.jobs.jobrun import Asked, JobRun, Record
from ocrwatch.jobs.quarantine import quarantine
from ocrwatch.jobs.reuse import Reuse
from ocrwatch.jobs.session import DocumentSession
from ocrwatch.jobs.steps import Probed, assemble_document, fetch_and_probe, job_lang, naming, timed
from ocrwatch.pages import render
from ocrwatch.pages.scheduler import (
    PageOutcome,
    PageScheduler,
    auto_active_documents,
    auto_render_ahead,
    auto_render_workers,
)
from ocrwatch.recognize import pagetext
from ocrwatch.recognize.recognizer import Recognizer
from ocrwatch.recognize.supervisor import EngineSupervisor
from ocrwatch.results import assemble
from ocrwatch.results import further as outputs
from ocrwatch.safefs import Access
from ocrwatch.sinks.base import Sink
from ocrwatch.sources.base import Answer, Job, Quarantine, Source
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.written import Written

__all__ = ["Pipeline", "Probed", "Progress", "job_id"]

log = structlog.get_logger()


@dataclass(frozen=True)
class Progress:
    """A job the pipeline holds: whether it has a slot now, and its pages once they are being
    recognised."""

    job: Job
    running: bool
    pages_done: int
    # None until its pages are in the scheduler (fetching, probing, writing, waiting)
    pages_total: int | None
    eta_seconds: float | None = (
        None  # the pages left at the rate of those done; None before the first
    )


class Pipeline:
    """source → ledger → render → scheduler → engine → sink, each job in a task of its own."""

    def __init__(self, cfg: Config, ledger: AsyncLedger | None, metrics: Metrics) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.metrics = metrics
        self.supervisor = EngineSupervisor(cfg, metrics)
        self.recognition = Recognizer(self.supervisor, metrics, cfg.output.images)
        # started by the daemon, after it resumes the ledger
        self.hooks = HookRunner(cfg.hook, ledger, metrics)
        # one for every render worker
        self.decode_budget = DecodeBudget(cfg.render.decode_budget_mb * 1024 * 1024)
        self.sources: dict[str, Source] = {}
        self.sinks: dict[str, Sink] = {}
        # the record of outputs: what is ocrwatch's own (None without a ledger: ``ocrwatch ocr``)
        self.written = Written(ledger.blocking) if ledger is not None else None
        # a source's fate once it is done
        self.archive = Archiver(cfg.output, self.sources, self.sinks, metrics, self.written)
        self.admission = Admission(
            ledger, self.sources, self.sinks, self.archive, self.hooks, self._offload, cfg.limits
        )
        self.reuse = Reuse(ledger, self.sinks, cfg.output, self._offload)
        self.scheduler: PageScheduler | None = None
        self.active_documents = 0
        self._slots: asyncio.Semaphore | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._runs: dict[str, JobRun] = {}  # by job key: every job this process holds
        self._draining = asyncio.Event()
        self._executors: dict[str, Executor] = {}

    async def start(self) -> None:
        """Start the engine, then size the scheduler and the document slots from what it can
        take."""
        render.check_renderer(self.cfg.render)
        engine = await self.supervisor.start()
        sched = self.cfg.scheduler
        max_inflight = sched.max_inflight_pages
        if not isinstance(max_inflight, int):  # "auto"
            max_inflight = engine.max_concurrency
        ahead, workers = sched.render_ahead, sched.render_workers
        documents = sched.max_active_documents
        self.scheduler = PageScheduler(
            max_inflight=max_inflight,
            render_ahead=ahead if isinstance(ahead, int) else auto_render_ahead(max_inflight),
            render_workers=(
                workers
                if isinstance(workers, int)
                else auto_render_workers(len(os.sched_getaffinity(0)))
            ),
            ageing_seconds=sched.ageing_seconds,
        )
        self.recognition.start(self.scheduler)
        self.active_documents = (
            documents if isinstance(documents, int) else auto_active_documents(max_inflight)
        )
        self._slots = asyncio.Semaphore(self.active_documents)
        if self.ledger is not None:
            self._dispatcher = asyncio.create_task(self._dispatch(), name="admission")
        budget = self.scheduler.budget
        log.info(
            "scheduler_ready",
            max_inflight=budget.max_inflight,
            render_ahead=budget.render_ahead,
            render_workers=budget.render_workers,
            max_active_documents=self.active_documents,
        )

    def add_source(self, source: Source, sink: Sink, executor: Executor | None = None) -> None:
        """``executor``: where the sink's blocking calls run (an S3 source's own pool, so a bucket
        that does not answer ties up no thread the ledger or another source needs); None for the
        default pool. The pipeline shuts it down at ``close``."""
        self.sources[source.name] = source
        self.sinks[source.name] = sink
        if executor is not None:
            self._executors[source.name] = executor

    def reconfigure(self, cfg: Config) -> None:
        """The configuration as reloaded: its inboxes' settings (lang, prompt, text) hold for the
        jobs that start from now on; the other sections take a restart, which the daemon says."""
        self.cfg = cfg

    def remove_source(self, name: str) -> None:
        """Forget the source ``name`` and its sink, once none of its jobs runs any more (an ``ocr``
        request's, when it ends)."""
        del self.sources[name], self.sinks[name]

    async def close(self) -> None:
        await self.hooks.stop()
        await self.recognition.stop()
        if self.scheduler is not None:
            await self.scheduler.close()
        await self.supervisor.close()
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)

    async def _offload(self, job: Job, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking call about ``job``'s sidecars, in the thread pool of the job's source (with
        the caller's context, as ``to_thread`` would: its log lines keep the job's id)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            self._executors.get(job.source), call
        )

    # --- admission (``admission.py``) ---------------------------------------------------------

    async def submit(self, job: Job) -> Answer:
        """Admit a job (idempotent); returns once it is durably in the ledger, or known settled:
        its answer, for its source to act on."""
        return await self.admission.submit(job)

    async def lapsed(self, jobs: list[Job]) -> list[Job]:
        """Those of ``jobs`` whose sidecars lapsed since they were done (a source's question)."""
        return await self.admission.lapsed_of(jobs)

    async def set_aside(self, request: Quarantine) -> None:
        """A source's move for a document that failed before (its ``submit`` answered ``failed``):
        the same move as a run's failure makes, its error sidecar along where it is ocrwatch's;
        where it went is the log's (nothing ran, so no hook is told)."""
        await quarantine(request, self.archive.written)

    async def resume(self) -> int:
        """Let the ledger's unfinished jobs start (at start, and after ``ocrwatch retry``); how many
        wait."""
        return await self.admission.resume(self.running())

    async def _dispatch(self) -> None:
        """Start each job the ledger has waiting, in the slot admission took for it."""
        held = 2 * self.active_documents  # a job in a backoff holds no slot: as many again
        assert self._slots is not None
        async for job in self.admission.waiting_jobs(self._slots, self._runs.keys(), held):
            self.start_job(job)

    def running(self) -> Collection[str]:
        """Keys of the jobs held in memory: in a slot, waiting for one, or waiting out a backoff."""
        return self._runs.keys()

    def start_job(self, job: Job, asked: Asked | None = None) -> asyncio.Task[str]:
        """Run the job in a task of its own, unless it already runs; the task's result is its final
        status. A job a source found is started by ``_dispatch``, in the slot admission took for
        it. One that ``asked`` for languages or a text mode (``ocrwatch ocr``) is never recorded in
        the ledger, and its task waits for a slot."""
        assert self._slots is not None, "Pipeline.start() first"
        existing = self._runs.get(job.key)
        if existing is not None and existing.task is not None and not existing.task.done():
            if asked is None:
                self._slots.release()
            return existing.task
        ledger = self.ledger if asked is None else None
        run = JobRun(job, Record(ledger, job.key), asked, given=asked is None)
        run.task = asyncio.create_task(self._run(run), name=f"job:{job_id(job)}")
        self._runs[job.key] = run
        run.task.add_done_callback(functools.partial(self._forget, run))
        return run.task

    def _forget(self, run: JobRun, task: asyncio.Task[str]) -> None:
        key = run.job.key
        if self._runs.get(key) is run:
            del self._runs[key]
            if run.given:  # cancelled before it took the slot given to it
                run.given = False
                assert self._slots is not None
                self._slots.release()
            if not self._draining.is_set():
                self.admission.ended(key)
            self.admission.wake()

    def progress(self) -> list[Progress]:
        """Every job this pipeline runs or holds, and how far its pages are (``ocrwatch status``,
        ``ocr``)."""
        out = []
        for run in self._runs.values():
            document = run.document
            done, total = (
                (len(document.outcomes), document.pages) if document is not None else (0, None)
            )
            eta = None
            if document is not None and done:
                eta = (document.pages - done) * (time.monotonic() - document.added) / done
            out.append(Progress(run.job, run.holding, done, total, eta))
        return out

    def update_gauges(self) -> None:
        """Queue depths, documents admitted and the oldest unfinished job: cheap enough for every
        scrape."""
        metrics = self.metrics
        if self.scheduler is not None:
            for stage, depth in self.scheduler.depth.items():
                metrics.queue_depth.labels(stage=stage).set(depth)
            metrics.inflight_pages.set(self.scheduler.budget.inflight)
        holding = sum(run.holding for run in self._runs.values())
        metrics.active_documents.labels(state="running").set(holding)
        held = len(self._runs) - holding
        metrics.active_documents.labels(state="waiting").set(held + self.admission.backlog)
        times = [run.job.detected_at for run in self._runs.values()]
        if self.admission.oldest is not None:  # admitted then: detected settle_seconds before
            times.append(self.admission.oldest)
        oldest = min(times, default=None)
        metrics.oldest_waiting.set(0.0 if oldest is None else max(time.time() - oldest, 0.0))

    async def drain(self, timeout: float) -> int:
        """Start nothing more, wait for running jobs up to ``timeout`` and cancel the rest: they
        stay unfinished in the ledger with the jobs that wait there, which one line counts. How many
        were cancelled."""
        self._draining.set()  # a job waiting out its backoff ends at once (see attempts.backoff)
        self.admission.stop()  # a file being hashed is let go: the next start's scan finds it
        deadline = asyncio.get_running_loop().time() + timeout
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        pending: set[asyncio.Task[str]] = set()
        if tasks := [run.task for run in self._runs.values() if run.task is not None]:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            # A render thread cannot be cancelled: its pdftoppm can, so it returns at once.
            children.kill_all()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.admission.say_left()
        await self.hooks.stop(max(0.0, deadline - asyncio.get_running_loop().time()))
        return len(pending)

    # --- one job: attempts ------------------------------------------------------------------------

    async def _run(self, run: JobRun) -> str:
        """The job's attempts, each in one of the ``max_active_documents`` slots (a job waiting out
        its backoff holds none, so the others go on); its final status."""
        job = run.job
        structlog.contextvars.bind_contextvars(job_id=job_id(job))
        attempts = 0
        try:
            async for attempt in attempts_of_a_job(self.cfg.retry, self.metrics, self._draining):
                with attempt:
                    async with self._slot(run):
                        if attempt.retry_state.attempt_number == 1:
                            log.info("job_started", uri=job.origin.uri, source=job.source)
                        attempts = await self._start_attempt(run)
                        try:
                            status = await self._process(run)
                        except asyncio.CancelledError:
                            await self._release_attempt(run)
                            raise
                        except Exception as exc:
                            # not the document's fault: queued again, attempt given back
                            if is_place_fault(exc):
                                attempts = await run.record.park(classify(exc).as_dict())
                            raise
        except asyncio.CancelledError:
            log.info("job_interrupted")
            raise
        except Exception as exc:
            await self.reject(job, classify(exc), attempts)
            return "failed"
        return status

    @contextlib.asynccontextmanager
    async def _slot(self, run: JobRun) -> AsyncIterator[None]:
        """One of ``max_active_documents`` slots, held by the run (the gauges and ``progress`` read
        it): the one the dispatcher took for it, the first time."""
        assert self._slots is not None, "Pipeline.start() first"
        if run.given:
            run.given = False
        else:
            await self._slots.acquire()
        run.holding = True
        try:
            yield
        finally:
            run.holding = False
            self._slots.release()

    async def _start_attempt(self, run: JobRun) -> int:
        """Count the attempt before it runs, so a document that kills the process cannot resume
        forever."""
        job = run.job
        attempts = await run.record.record_attempt()
        if attempts is not None and attempts > self.cfg.retry.attempts:
            raise CrashLoop(
                f"{job.origin.uri}: {attempts - 1} attempts used up in runs of the daemon that "
                "ended uncleanly"
                " (killed, out of memory, power lost)"
            )
        return attempts or 1

    async def _release_attempt(self, run: JobRun) -> None:
        """A clean shutdown interrupted the attempt (the job task is cancelled only while draining):
        it is given back, so only an unclean end (``kill -9``, power loss) counts toward
        ``crash_loop``."""
        try:
            await run.record.release_attempt()
        # never turns the stop into a failure: the attempt stays counted, no more
        except Exception as exc:
            log.warning("attempt_not_released", kind=classify(exc).kind, error=str(exc))

    # --- one job: the steps -----------------------------------------------------------------------

    async def _process(self, run: JobRun) -> str:
        """One attempt at a document: the steps in order, each timed into the sidecar's stages."""
        job, record = run.job, run.record
        engine = self.supervisor.engine
        assert self.scheduler is not None and engine is not None
        started = time.time()
        stages: dict[str, float] = {"waiting": started - job.detected_at}
        async with DocumentSession(
            job_id(job), self.cfg.state_dir / "tmp", engine, self.scheduler
        ) as session:
            assert session.spool_dir is not None
            await record.set_state("rendering")
            with timed(stages, "fetch_probe"):
                source = self.sources[job.source]
                probed = await fetch_and_probe(self.cfg, source, run, session.spool_dir, engine)
            provenance = steps.provenance(self.cfg, run, engine, probed, self.supervisor.prompted)
            owner = probed.access.uid if probed.access is not None else None
            formats = steps.job_formats(self.cfg, source, job)
            reused = None
            if run.recorded:
                reused = await self.reuse.find(job, probed.sha256, provenance, owner, formats)
            made = outputs.NONE
            if reused is None:
                await record.set_state("recognizing", pages_total=probed.info.pages)
                with timed(stages, "pages"):
                    pages = await self.render_and_recognize(run, session, probed)
                await record.set_state("writing")
                made = await outputs.prepare(
                    self.cfg.output,
                    job.origin,
                    probed,
                    pages,
                    session.spool_dir,
                    stages,
                    self.decode_budget,
                    formats,
                    provenance.engine,
                )
            with timed(stages, "write"):  # set after the sidecar's copy of the stages is taken
                if reused is None:
                    document = assemble_document(job, provenance, pages, started, stages, made)
                    markdown = assemble.markdown(pages, made.assets)
                else:
                    document, markdown = reused.document, reused.markdown
                await self._unchanged(job, probed)
                event = await self._hold(run, job, document)  # before it is published
                await self.write_sidecars(job, markdown, document, made, probed.access)
        pages = document["pages"]
        await record.set_state("writing", pages_done=len(pages))
        await record.mark_done()
        moved = await self._offload(
            job,
            self.archive.apply_on_success,
            job,
            document["status"],
            probed.sha256,
            probed.changed,
            probed.read,
        )
        await self.hooks.release(event, moved)  # the hooks are told where a move took the sidecars
        self.recognition.record_success(job, document["status"], stages)
        await self.sources[job.source].finish(job, "done")
        log.info(
            "job_done",
            status=document["status"],
            pages=len(pages),
            seconds=round(time.time() - started, 3),
            uri=job.origin.uri,
        )
        return str(document["status"])

    async def _hold(self, run: JobRun | None, job: Job, document: dict[str, Any]) -> int | None:
        """The result recorded for the hooks before it is published; none for a job the ledger never
        hears of (``ocrwatch ocr``, which runs no hooks without a daemon either)."""
        if run is not None and not run.recorded:
            return None
        return await self.hooks.hold(job, document, self.sinks[job.source])

    async def render_and_recognize(
        self, run: JobRun, session: DocumentSession, probed: Probed
    ) -> list[PageOutcome]:
        """Every page through the shared scheduler, in order. A source rewritten meanwhile is tried
        again whole rather than given pages of two versions."""
        assert self.scheduler is not None
        job = run.job
        run.lang = job_lang(self.cfg, run)
        text = run.asked.text if run.asked is not None else None
        maker = pagetext.pages(
            self.cfg,
            job.origin,
            probed,
            text,
            self.supervisor.kind,
            run.lang,
            self.decode_budget,
            self.metrics.stage_seconds.labels(stage="render").observe,
            session.job_id,
        )
        # the scheduler asks for each page to be rendered, then recognised: ``recognition`` answers
        try:
            with (
                self.recognition.reading(session.job_id, run.lang, maker),
                naming(probed.path, job.origin),
            ):
                session.document = self.scheduler.add(
                    session.job_id,
                    priority=job.priority,
                    detected_at=job.detected_at,
                    pages=probed.info.pages,
                    prompt=self.cfg.prompt_text(job.prompt),
                )
                run.document = session.document
                pages = await session.document.future
        # a page of the replacement, rendered with the old one's page count
        except PermanentError as exc:
            if await asyncio.to_thread(probed.changed):
                raise SourceChanged(
                    f"{job.origin.uri} changed while it was processed ({exc.kind})"
                ) from exc
            raise
        finally:
            run.document = None
        # Checked after recognition, before the further outputs are made from it (inode and ctime
        # too: a rewrite may keep size and mtime); ``_unchanged`` asks again before publishing.
        await self._unchanged(job, probed)
        return pages

    async def _unchanged(self, job: Job, probed: Probed) -> None:
        """Raise ``SourceChanged`` (retried: the next attempt reads the new content) when the source
        no longer holds the version fetched. Asked again right before the outputs are published, so
        that a source truncated or rewritten while its outputs were made never gets sidecars of its
        old bytes, nor waits for its writer's next event to be read again."""
        if await asyncio.to_thread(probed.changed):
            raise SourceChanged(f"{job.origin.uri} changed while it was processed")

    async def write_sidecars(
        self,
        job: Job,
        markdown: str,
        document: dict[str, Any],
        made: outputs.Outputs,
        access: Access | None,
    ) -> None:
        """The Markdown, the further outputs, then the JSON (the commit marker), through the job's
        sink."""
        sink = self.sinks[job.source]
        await self._offload(job, sink.write, job, markdown, document, made.files, access)

    # --- giving up --------------------------------------------------------------------------------

    async def reject(self, job: Job, error: OcrwatchError, attempts: int) -> None:
        """Give a job up: logged, counted, its error sidecar written beside the source (none for a
        vanished source: nothing to sit beside, and the ledger re-admits it if it returns), recorded
        in the ledger, and its source told. An error sidecar that a fault of its path kept from
        being written (a folder swapped for a link) makes that fault the failure recorded, so the
        document comes back like a vanished one. The pipeline calls it when a job's attempts are
        spent; a source calls it (it is handed to ``Source.start``) for a job it must give up
        unprocessed, such as an S3 poison message."""
        run = self._runs.get(job.key)
        record = run.record if run is not None else Record(self.ledger, job.key)
        if run is None:  # from a source: the job never ran here
            fingerprint = await asyncio.to_thread(self.admission.fingerprint, job)
            if fingerprint is not None:
                # A duplicate whose acknowledgement was lost.
                if await self.admission.done_already(job, fingerprint):
                    await self.sources[job.source].finish(job, "done")
                    return
                await record.admit(job, fingerprint)  # so the failure has a row to be recorded in
        log.error(
            "job_failed",
            uri=job.origin.uri,
            kind=error.kind,
            error=error.message,
            hint=error.hint,
            retryable=error.retryable,
            attempts=attempts,
        )
        self.metrics.documents.labels(status="failed").inc()
        body = assemble.error_document(
            assemble.source_section(job, None, run.read if run is not None else None, None),
            error.as_dict(),
            attempts,
            time.time(),
        )
        event = await self._hold(run, job, body)  # before the failure is recorded
        standing = error
        if not isinstance(error, SourceGone):
            try:
                await self._offload(job, self.sinks[job.source].write_error, job, body)
            except Exception as exc:
                unwritten = classify(exc)
                log.error("error_sidecar_failed", kind=unwritten.kind, error=str(exc))
                if unwritten.path_fault:
                    # A failure no one could see, for what the path was then: recorded as that, it
                    # comes back when the file is seen whole at its path again.
                    standing = unwritten
        await record.mark_failed(standing.as_dict())
        asked = await self.sources[job.source].finish(job, "failed", standing.kind)
        moved = None if asked is None else await quarantine(asked, self.written)
        await self.hooks.release(event, moved)  # told where a quarantine took the source
