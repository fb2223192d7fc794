"""Each page the scheduler asks for, answered by the engine, and the figures that record it.

The pipeline holds one ``Recognition``: it answers the scheduler's page asks in tasks of their own,
in the languages of each document's job, has the supervisor rebuild an engine that died, and counts
pages, tokens and engine phases as they finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

from ocrwatch.engines.base import PageRequest
from ocrwatch.errors import EngineDead
from ocrwatch.infra.metrics import ENGINE_PHASES, Metrics
from ocrwatch.pages.scheduler import PageAsk, PageScheduler
from ocrwatch.recognize import figures, ladder
from ocrwatch.recognize.supervisor import EngineSupervisor
from ocrwatch.sources.base import Job

__all__ = ["Recognition"]


class Recognition:
    """The page answers and their figures, from the engine the supervisor holds and rebuilds."""

    def __init__(self, supervisor: EngineSupervisor, metrics: Metrics, images: str) -> None:
        self.supervisor = supervisor
        self.metrics = metrics
        self._extract = figures.extractor(images)  # ``[output] images``: a reload keeps it
        self._langs: dict[str, str | None] = {}  # by job id, while its pages are recognised
        self._loops: list[asyncio.Task[None]] = []

    def start(self, scheduler: PageScheduler) -> None:
        """Answer the scheduler's page asks and its engine deaths, each in a task of its own."""
        self._loops = [
            asyncio.create_task(self._answer_pages(scheduler), name="page-answers"),
            asyncio.create_task(self._revive(scheduler), name="engine-revive"),
        ]

    async def stop(self) -> None:
        """Both loops cancelled and ended."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    async def _revive(self, scheduler: PageScheduler) -> None:
        """Each engine death the scheduler yields, answered by the supervisor's rebuild."""
        async for _ in scheduler.engine_deaths():
            await self.supervisor.rebuild(scheduler)

    @contextlib.contextmanager
    def languages(self, doc_id: str, lang: str | None) -> Iterator[None]:
        """The document's pages are recognised in ``lang`` (None: the engine's own) in the block."""
        self._langs[doc_id] = lang
        try:
            yield
        finally:
            self._langs.pop(doc_id, None)

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


def _cancel(task: asyncio.Task[Any], future: object) -> None:
    """A page's answer is dropped once nobody waits for it (its document cancelled)."""
    task.cancel()
