"""The engine's supervision: which engine runs, and a new one built (with backoff) when it dies.

The scheduler yields each death (``PageScheduler.engine_deaths``, its dispatch paused); ``rebuild``
requeues the pages that were in flight and builds a new engine: no page is lost, documents wait.
"""

from __future__ import annotations

import asyncio

import structlog
from tenacity import AsyncRetrying, wait_exponential_jitter

from ocrwatch.config import Config
from ocrwatch.engines import registry
from ocrwatch.engines.base import Engine, Judge, PageRequest
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import EngineDead
from ocrwatch.infra.metrics import Metrics
from ocrwatch.pages.scheduler import PageScheduler
from ocrwatch.recognize import ladder

log = structlog.get_logger()

CLOSE_TIMEOUT_SECONDS = 60.0


class EngineSupervisor:
    """Owns the current engine; rebuilds it with backoff after a death and requeues the pages in
    flight."""

    def __init__(self, cfg: Config, metrics: Metrics) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self.engine: Engine | None = None
        self.kind = cfg.engine.kind
        self._rungs: list[Sampling] = []
        self._judge: Judge | None = None
        self.prompted = True
        """Whether the engine now running reads a prompt and samples (``EngineSpec.prompted``)."""

    async def start(self) -> Engine:
        """Choose, build and start the engine; a warning only where ``auto`` passed over an engine
        that is installed but cannot run here (``registry.fell_back``), since passing over one not
        installed is what ``auto`` means."""
        kind, reason = registry.choose(self._cfg.engine, registry.chosen_by(self._cfg))
        spec, cfg = registry.find(kind), self._cfg.engine
        self.kind, self._rungs, self._judge = kind, spec.rungs(cfg), spec.judge(cfg)
        self.prompted = spec.prompted
        loud = registry.fell_back(cfg, kind)
        (log.warning if loud else log.info)("engine_selected", engine=kind, reason=reason)
        engine = spec.build(cfg, self._cfg.output.images, self._cfg.log)
        await engine.start()
        self.engine = engine
        return engine

    async def rebuild(self, scheduler: PageScheduler) -> None:
        """After a death ``scheduler`` reported (its dispatch paused): requeue its pages in
        flight, build a new engine with backoff, then let the scheduler dispatch again."""
        scheduler.pause_engine()
        requeued = scheduler.requeue_inflight()
        self._metrics.engine_restarts.inc()
        self._metrics.retries.labels(stage="engine").inc(requeued)
        log.error("engine_dead", requeued_pages=requeued)
        old, self.engine = self.engine, None
        if old is not None:
            try:
                await asyncio.wait_for(old.close(), CLOSE_TIMEOUT_SECONDS)
            except Exception as exc:
                log.warning("engine_close_failed", error=str(exc))
        async for attempt in AsyncRetrying(
            wait=wait_exponential_jitter(multiplier=1, max=60), reraise=True
        ):
            with attempt:
                self.engine = await self.start()
        log.info("engine_rebuilt")
        scheduler.resume_engine()

    async def recognize(self, request: PageRequest) -> ladder.PageResult:
        """One page through the retry ladder of the engine now running."""
        engine, judge = self.engine, self._judge
        if engine is None or judge is None:
            raise EngineDead("engine is being rebuilt")
        return await ladder.recognize_page(
            engine,
            request,
            self._rungs,
            self._cfg.engine.page_timeout_seconds,
            judge,
            sampled=self.prompted,
        )

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
