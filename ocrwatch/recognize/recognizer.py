"""Each page the scheduler asks for, rendered, answered by the engine, and the figures that record
it.

The pipeline holds one ``Recognizer``: it answers the scheduler's render asks in its
``render_workers`` threads with each document's page maker (``pagetext.Pages``), its page asks in
tasks of their own in the languages of each document's job, has the supervisor rebuild an engine
that died, and counts pages, tokens and engine phases as they finish. The scheduler below holds
none of these: it is fed what they make.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ocrwatch.engines.base import PageRequest
from ocrwatch.errors import EngineDead
from ocrwatch.infra.metrics import ENGINE_PHASES, Metrics
from ocrwatch.pages.render import RenderedPage
from ocrwatch.pages.scheduler import Checked, PageAsk, PageScheduler, RenderAsk
from ocrwatch.recognize import figures, ladder
from ocrwatch.recognize.supervisor import EngineSupervisor
from ocrwatch.sources.base import Job

__all__ = ["PageMaker", "Recognizer"]

PageMaker = Callable[[int], RenderedPage | Checked]
"""A document's page maker (``pagetext.Pages``): page ``index`` rendered, or its text check's
outcome. Blocking: called in a render thread."""


class Recognizer:
    """The page answers and their figures, from the engine the supervisor holds and rebuilds."""

    def __init__(self, supervisor: EngineSupervisor, metrics: Metrics, images: str) -> None:
        self.supervisor = supervisor
        self.metrics = metrics
        self._extract = figures.extractor(images)  # ``[output] images``: a reload keeps it
        self._langs: dict[str, str | None] = {}  # by job id, while its pages are recognised
        self._makers: dict[str, PageMaker] = {}  # by job id, while its pages are rendered
        self._loops: list[asyncio.Task[None]] = []
        self._render_threads: ThreadPoolExecutor | None = None

    def start(self, scheduler: PageScheduler) -> None:
        """Answer the scheduler's render asks (in ``render_workers`` threads of its own), its page
        asks and its engine deaths, each in a task of its own."""
        self._render_threads = ThreadPoolExecutor(
            scheduler.budget.render_workers, thread_name_prefix="ocrwatch-render"
        )
        self._loops = [
            asyncio.create_task(self._answer_renders(scheduler), name="render-answers"),
            asyncio.create_task(self._answer_pages(scheduler), name="page-answers"),
            asyncio.create_task(self._revive(scheduler), name="engine-revive"),
        ]

    async def stop(self) -> None:
        """The loops cancelled and ended; the render threads let go (a page rendering now ends in
        its own time: its pdftoppm is killed by the drain)."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._render_threads is not None:
            self._render_threads.shutdown(wait=False, cancel_futures=True)

    async def _revive(self, scheduler: PageScheduler) -> None:
        """Each engine death the scheduler yields, answered by the supervisor's rebuild."""
        async for _ in scheduler.engine_deaths():
            await self.supervisor.rebuild(scheduler)

    @contextlib.contextmanager
    def reading(self, doc_id: str, lang: str | None, maker: PageMaker) -> Iterator[None]:
        """In the block, the document's pages are made by ``maker`` and recognised in ``lang``
        (None: the engine's own)."""
        self._langs[doc_id], self._makers[doc_id] = lang, maker
        try:
            yield
        finally:
            self._langs.pop(doc_id, None)
            self._makers.pop(doc_id, None)

    async def _answer_renders(self, scheduler: PageScheduler) -> None:
        """Each page the scheduler asks to have rendered, made in a render thread by its document's
        maker; the ask's cancellation lets the page go (a thread cannot be stopped: its result is
        dropped)."""
        loop = asyncio.get_running_loop()
        async for ask in scheduler.render_asks():
            work = loop.run_in_executor(self._render_threads, self._make, ask)
            work.add_done_callback(ask.take)
            ask.future.add_done_callback(functools.partial(_cancel, work))

    def _make(self, ask: RenderAsk) -> RenderedPage | Checked:
        """One page of the ask's document (blocking). A document no longer read has no maker: its
        page fails, and with it nothing, as the document has already ended."""
        maker = self._makers.get(ask.doc.doc_id)
        if maker is None:
            raise LookupError(f"{ask.doc.doc_id}: no longer read")
        return maker(ask.index)

    async def _answer_pages(self, scheduler: PageScheduler) -> None:
        """Each page the scheduler asks for, recognised in a task of its own that the ask's
        cancellation cancels (the engine request aborted with it)."""
        answering: set[asyncio.Task[tuple[Any, tuple[Any, ...]]]] = set()
        async for ask in scheduler.page_asks():
            name = f"answer:{ask.request.request_id}"
            task = asyncio.create_task(self._answer_page(ask), name=name)
            answering.add(task)
            task.add_done_callback(answering.discard)
            task.add_done_callback(ask.take)
            ask.future.add_done_callback(functools.partial(_cancel, task))

    async def _answer_page(self, ask: PageAsk) -> tuple[ladder.PageResult, tuple[Any, ...]]:
        """One page recognised in its inbox's languages, and the figures cut from its image."""
        lang = self._langs.get(ask.doc.doc_id)
        result = await self._recognize(dataclasses.replace(ask.request, lang=lang))
        extract = self._extract
        return result, (await extract(ask.request, result) if extract is not None else ())

    async def _recognize(self, request: PageRequest) -> ladder.PageResult:
        """One page through the engine, recorded as it finishes, so a long document's progress shows
        live."""
        started = time.monotonic()
        try:
            result = await self.supervisor.recognize(request)
        except EngineDead:
            self.metrics.retries.labels(stage="engine").inc()  # the scheduler requeues the page
            raise
        metrics = self.metrics
        metrics.stage_seconds.labels(stage="recognize").observe(time.monotonic() - started)
        metrics.pages.labels(status=result.status).inc()
        metrics.retries.labels(stage="page").inc(max(len(result.attempts) - 1, 0))
        for kind in ("prompt", "completion"):
            tokens = sum(attempt.get(f"{kind}_tokens") or 0 for attempt in result.attempts)
            metrics.tokens.labels(kind=kind).inc(tokens)
        if result.recognition is not None:
            for phase, seconds in result.recognition.timings.items():
                if phase in ENGINE_PHASES:
                    metrics.engine_seconds.labels(phase=phase).observe(seconds)
        return result

    def record_success(self, job: Job, status: str, stages: dict[str, float]) -> None:
        """Document-level figures; pages and tokens were recorded as each page finished."""
        self.metrics.documents.labels(status=status).inc()
        self.metrics.stage_seconds.labels(stage="end_to_end").observe(time.time() - job.detected_at)
        for stage, seconds in stages.items():  # not the sidecar's copy: taken before the write
            self.metrics.stage_seconds.labels(stage=stage).observe(seconds)


def _cancel(task: asyncio.Future[Any], future: object) -> None:
    """A page's answer is dropped once nobody waits for it (its document cancelled)."""
    task.cancel()
