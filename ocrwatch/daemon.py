"""The one place where sources, ledger, renderer, scheduler, engine and sinks are composed.

``Pipeline`` turns a ``Job`` into sidecars (used by ``ocrwatch run`` and ``ocrwatch ocr``). ``Daemon`` adds the
life cycle around it: ``startup`` → ``main_loop`` → ``shutdown``, signals (handlers only set events), systemd
notification, the health tick and config reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from ocrwatch import assemble, config as config_module, ladder, render
from ocrwatch.config import Config
from ocrwatch.engines import factory
from ocrwatch.engines.base import Engine, PageRequest
from ocrwatch.errors import (
    ConfigError, CrashLoop, EngineDead, OcrwatchError, PermanentError, SourceChanged, SourceGone, classify,
)
from ocrwatch.ledger import Fingerprint, Ledger, same_content, sha256_file
from ocrwatch.metrics import ENGINE_PHASES, HealthServer, LoopLagProbe, Metrics
from ocrwatch.scheduler import PageScheduler, auto_active_documents, auto_render_ahead, auto_render_workers
from ocrwatch.session import DocumentSession
from ocrwatch.sinks.base import Sink
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile, S3Object, Source

log = structlog.get_logger()


def job_id(job: Job) -> str:
    return hashlib.sha1(job.key.encode()).hexdigest()[:12]


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and classify(exc).retryable and not isinstance(exc, EngineDead)


class EngineSupervisor:
    """Owns the current engine; rebuilds it with backoff after a death and requeues the pages in flight."""

    def __init__(self, cfg: Config, metrics: Metrics) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self.engine: Engine | None = None
        self.kind = cfg.engine.kind
        self.scheduler: PageScheduler | None = None
        self._rebuild: asyncio.Task[None] | None = None

    async def start(self) -> Engine:
        kind, reason = factory.choose(self._cfg.engine)
        self.kind = kind
        loud = kind == "tesseract" and self._cfg.engine.kind == "auto"
        (log.warning if loud else log.info)("engine_selected", engine=kind, reason=reason)
        engine = factory.build(self._cfg.engine, self._cfg.output.images, kind=kind, log=self._cfg.log)
        await engine.start()
        self.engine = engine
        return engine

    def dead(self) -> None:
        if self._rebuild is None or self._rebuild.done():
            # Pause now, not when the rebuild task first runs: the page that reported the death is requeued
            # right after this returns, and a page dispatched in between would be cancelled before its task
            # ever ran, which loses the page and its in-flight slot.
            if self.scheduler is not None:
                self.scheduler.pause_engine()
            self._rebuild = asyncio.create_task(self._rebuild_engine())

    async def _rebuild_engine(self) -> None:
        assert self.scheduler is not None
        self.scheduler.pause_engine()
        requeued = self.scheduler.requeue_inflight()
        self._metrics.engine_restarts.inc()
        self._metrics.retries.labels(stage="engine").inc(requeued)
        log.error("engine_dead", requeued_pages=requeued)
        old, self.engine = self.engine, None
        if old is not None:
            try:
                await asyncio.wait_for(old.close(), 60)
            except Exception as exc:
                log.warning("engine_close_failed", error=str(exc))
        async for attempt in AsyncRetrying(wait=wait_exponential_jitter(initial=1, max=60), reraise=True):
            with attempt:
                self.engine = await self.start()
        log.info("engine_rebuilt")
        self.scheduler.resume_engine()

    async def recognize(self, request: Any) -> Any:
        engine = self.engine
        if engine is None:
            raise EngineDead("engine is being rebuilt")
        return await ladder.recognize_page(
            engine, request, ladder.rungs(self._cfg.engine, self.kind), self._cfg.engine.page_timeout_seconds,
            judge=ladder.judge_for(self.kind, self._cfg.engine),
        )

    async def close(self) -> None:
        if self._rebuild is not None:
            self._rebuild.cancel()
        if self.engine is not None:
            await self.engine.close()


class Pipeline:
    """source → ledger → render → scheduler → engine → sink, for one job at a time per task."""

    def __init__(self, cfg: Config, ledger: Ledger | None, metrics: Metrics) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.metrics = metrics
        self.supervisor = EngineSupervisor(cfg, metrics)
        self.sources: dict[str, Source] = {}
        self.sinks: dict[str, Sink] = {}
        self.scheduler: PageScheduler | None = None
        self.active_documents = 0
        self._slots: asyncio.Semaphore | None = None
        self._tasks: dict[str, asyncio.Task[str]] = {}
        self._detected: dict[str, float] = {}
        self._running = 0

    async def start(self) -> None:
        render.check_renderer(self.cfg.render)
        engine = await self.supervisor.start()
        sched = self.cfg.scheduler
        max_inflight = sched.max_inflight_pages or engine.max_concurrency
        self.scheduler = PageScheduler(
            lambda doc, request: self._recognize(request),
            max_inflight=max_inflight,
            render_ahead=sched.render_ahead or auto_render_ahead(max_inflight),
            render_workers=sched.render_workers or auto_render_workers(len(os.sched_getaffinity(0))),
            ageing_seconds=sched.ageing_seconds,
            on_engine_dead=self.supervisor.dead,
        )
        self.supervisor.scheduler = self.scheduler
        self.active_documents = sched.max_active_documents or auto_active_documents(max_inflight)
        self._slots = asyncio.Semaphore(self.active_documents)
        budget = self.scheduler.budget
        log.info(
            "scheduler_ready",
            max_inflight=budget.max_inflight,
            render_ahead=budget.render_ahead,
            render_workers=budget.render_workers,
            max_active_documents=self.active_documents,
        )

    async def _ledger(self, method: str, *args: Any, **fields: Any) -> Any:
        """Ledger calls run in a thread: another process holding the database lock must not stall the loop."""
        if self.ledger is None:
            return None
        return await asyncio.to_thread(getattr(self.ledger, method), *args, **fields)

    def add_source(self, source: Source, sink: Sink) -> None:
        self.sources[source.name] = source
        self.sinks[source.name] = sink

    @property
    def active(self) -> int:
        return len(self._tasks)

    # --- admission ----------------------------------------------------------------------------------------

    async def submit(self, job: Job) -> None:
        """Admit a job (idempotent); returns once it is durably in the ledger, or known to be done."""
        fingerprint = await asyncio.to_thread(self._fingerprint, job)
        if fingerprint is None:
            return
        sink = self.sinks[job.source]
        recorded = await asyncio.to_thread(sink.recorded, job)
        if recorded is not None and same_content(_recorded_fingerprint(recorded), fingerprint):
            await self._ledger("admit", job, fingerprint)
            await self._ledger("mark_done", job.key)
            log.info("job_already_done", job_id=job_id(job), uri=job.origin.uri)
            await self.sources[job.source].finish(job, "done")
            return
        if self.ledger is not None and not await self._ledger("admit", job, fingerprint):
            row = await self._ledger("known", job.key)
            if row is not None and row.state in ("done", "failed"):
                await self.sources[job.source].finish(job, row.state)
            return
        self.start_job(job)

    def _fingerprint(self, job: Job) -> Fingerprint | None:
        origin = job.origin
        if isinstance(origin, S3Object):
            return Fingerprint(size=origin.size or 0, mtime_ns=None, sha256=None, etag=origin.etag, version_id=origin.version_id)
        try:
            stat = origin.path.stat()
        except OSError:
            return None
        if self.ledger is not None:
            row = self.ledger.known(job.key)
            if (
                row is not None
                and row.fingerprint is not None
                and row.state == "done"
                and (row.fingerprint.size, row.fingerprint.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
            ):
                return row.fingerprint
        try:
            digest = sha256_file(origin.path) if os.path.isfile(origin.path) else None
        except OSError:
            digest = None
        return Fingerprint(size=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=digest)

    def start_job(self, job: Job) -> asyncio.Task[str]:
        existing = self._tasks.get(job.key)
        if existing is not None and not existing.done():
            return existing
        task = asyncio.create_task(self._run(job), name=f"job:{job_id(job)}")
        self._tasks[job.key] = task
        self._detected[job.key] = job.detected_at
        task.add_done_callback(functools.partial(self._forget, job.key))
        return task

    def _forget(self, key: str, task: asyncio.Task[str]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            del self._detected[key]

    def update_gauges(self) -> None:
        """Queue depths, documents admitted and the oldest unfinished job: cheap enough for every scrape."""
        metrics = self.metrics
        if self.scheduler is not None:
            for stage, depth in self.scheduler.depth.items():
                metrics.queue_depth.labels(stage=stage).set(depth)
            metrics.inflight_pages.set(self.scheduler.budget.inflight)
        metrics.active_documents.labels(state="running").set(self._running)
        metrics.active_documents.labels(state="waiting").set(max(len(self._tasks) - self._running, 0))
        oldest = min(self._detected.values(), default=None)
        metrics.oldest_waiting.set(0.0 if oldest is None else max(time.time() - oldest, 0.0))

    async def drain(self, timeout: float) -> int:
        """Wait for running jobs up to ``timeout``; cancel the rest (they stay unfinished in the ledger)."""
        tasks = list(self._tasks.values())
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    async def wait_all(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    # --- one job ----------------------------------------------------------------------------------------------

    async def _run(self, job: Job) -> str:
        jid = job_id(job)
        structlog.contextvars.bind_contextvars(job_id=jid)
        async with self._slot():
            log.info("job_started", uri=job.origin.uri, source=job.source)
            attempts = 0

            def before_sleep(state: RetryCallState) -> None:
                error = classify(state.outcome.exception()) if state.outcome else None
                self.metrics.retries.labels(stage="document").inc()
                log.warning(
                    "job_retry", attempt=state.attempt_number, kind=error.kind if error else None,
                    error=error.message if error else None, wait=round(state.upcoming_sleep, 2),
                )

            retry = self.cfg.retry
            try:
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(retry.attempts),
                    wait=wait_exponential_jitter(initial=retry.backoff_initial_seconds, max=retry.backoff_max_seconds),
                    retry=retry_if_exception(_is_transient),
                    before_sleep=before_sleep,
                    reraise=True,
                ):
                    with attempt:
                        attempts = await self._start_attempt(job)
                        status = await self._process(job, jid)
            except asyncio.CancelledError:
                log.info("job_interrupted")
                raise
            except Exception as exc:
                error = classify(exc)
                await self._fail(job, error, attempts)
                return "failed"
        return status

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of ``max_active_documents`` slots, counted for the active-documents gauge."""
        assert self._slots is not None, "Pipeline.start() first"
        async with self._slots:
            self._running += 1
            try:
                yield
            finally:
                self._running -= 1

    async def _recognize(self, request: PageRequest) -> ladder.PageResult:
        """One page through the engine, recorded as it finishes, so a long document's progress shows live."""
        started = time.monotonic()
        try:
            result: ladder.PageResult = await self.supervisor.recognize(request)
        except EngineDead:
            self.metrics.retries.labels(stage="engine").inc()  # the scheduler requeues the page
            raise
        metrics = self.metrics
        metrics.stage_seconds.labels(stage="recognize").observe(time.monotonic() - started)
        metrics.pages.labels(status=result.status).inc()
        metrics.retries.labels(stage="page").inc(max(len(result.attempts) - 1, 0))
        for kind in ("prompt", "completion"):
            metrics.tokens.labels(kind=kind).inc(sum(attempt.get(f"{kind}_tokens") or 0 for attempt in result.attempts))
        if result.recognition is not None:
            for phase, seconds in result.recognition.timings.items():
                if phase in ENGINE_PHASES:
                    metrics.engine_seconds.labels(phase=phase).observe(seconds)
        return result

    def _render_page(
        self, path: Path, info: render.DocumentInfo, spec: render.RenderSpec, index: int
    ) -> render.RenderedPage:
        """Runs in a render worker thread (prometheus_client is thread-safe); records each page as it is made."""
        page = render.render_page(path, info, index, spec=spec)
        self.metrics.stage_seconds.labels(stage="render").observe(page.seconds)
        return page

    async def _start_attempt(self, job: Job) -> int:
        """Count the attempt before it runs, so a document that kills the process cannot resume forever."""
        attempts = await self._ledger("record_attempt", job.key, None)
        if attempts is not None and attempts > self.cfg.retry.attempts:
            raise CrashLoop(f"{job.origin.uri} was interrupted {attempts - 1} times while being processed")
        return attempts or 1

    async def _process(self, job: Job, jid: str) -> str:
        assert self.scheduler is not None and self.supervisor.engine is not None
        cfg, sink = self.cfg, self.sinks[job.source]
        started = time.time()
        stages: dict[str, float] = {"waiting": started - job.detected_at}
        async with DocumentSession(jid, cfg.state_dir / "tmp", self.supervisor.engine, self.scheduler) as session:
            await self._ledger("set_state", job.key, "rendering")
            assert session.spool_dir is not None
            t0 = time.monotonic()
            path = await self.sources[job.source].fetch(job, session.spool_dir)
            before = await asyncio.to_thread(_stat_key, path)
            limits = render.Limits(
                max_bytes=job.max_bytes or cfg.limits.max_bytes, max_pages=job.max_pages or cfg.limits.max_pages
            )
            info = await asyncio.to_thread(render.probe, path, limits)
            spec = render.render_spec(cfg.render, self.supervisor.engine.render_hint)
            if info.kind == "pdf":
                for width, height in info.page_sizes:
                    render.page_dpi(width, height, spec)
            digest = await asyncio.to_thread(sha256_file, path)
            stages["fetch_probe"] = time.monotonic() - t0
            await self._ledger("set_state", job.key, "recognizing", pages_total=info.pages)
            engine = self.supervisor.engine
            t0 = time.monotonic()
            session.document = self.scheduler.add(
                jid,
                priority=job.priority,
                detected_at=job.detected_at,
                pages=info.pages,
                prompt=cfg.prompt_text(job.prompt),
                render=functools.partial(self._render_page, path, info, spec),
            )
            try:
                pages = await session.document.future
            except PermanentError as exc:  # a page of the replacement, rendered with the old one's page count
                if await asyncio.to_thread(_changed, path, before):
                    raise SourceChanged(f"{job.origin.uri} changed while it was processed ({exc.kind})") from exc
                raise
            stages["pages"] = time.monotonic() - t0
            if await asyncio.to_thread(_stat_key, path) != before:
                raise SourceChanged(f"{job.origin.uri} changed while it was processed")
            await self._ledger("set_state", job.key, "writing")
            t0 = time.monotonic()
            provenance = assemble.Provenance(
                source=_source_section(job, path, digest, info.mime),
                engine=engine.describe() | {"prompt": cfg.prompt_text(job.prompt)},
                render={"dpi": spec.dpi, "max_side": spec.max_side, "max_pixels": spec.max_pixels},
            )
            finished = time.time()
            document = assemble.document(
                provenance, pages, detected=job.detected_at, started=started, finished=finished, stages=stages
            )
            await asyncio.to_thread(sink.write, job, assemble.markdown(pages), document)
            stages["write"] = time.monotonic() - t0
        await self._ledger("set_state", job.key, "writing", pages_done=len(pages))
        await self._ledger("mark_done", job.key)
        self._record_success(job, document["status"], stages)
        await self.sources[job.source].finish(job, "done")
        log.info(
            "job_done", status=document["status"], pages=len(pages), seconds=round(time.time() - started, 3),
            uri=job.origin.uri,
        )
        return str(document["status"])

    def _record_success(self, job: Job, status: str, stages: dict[str, float]) -> None:
        """Document-level figures; pages and tokens were recorded as each page finished."""
        self.metrics.documents.labels(status=status).inc()
        self.metrics.stage_seconds.labels(stage="end_to_end").observe(time.time() - job.detected_at)
        for stage, seconds in stages.items():  # not the sidecar's copy: it was taken before the write
            self.metrics.stage_seconds.labels(stage=stage).observe(seconds)

    async def _fail(self, job: Job, error: OcrwatchError, attempts: int) -> None:
        log.error(
            "job_failed", uri=job.origin.uri, kind=error.kind, error=error.message, hint=error.hint,
            retryable=error.retryable, attempts=attempts,
        )
        self.metrics.documents.labels(status="failed").inc()
        await self._ledger("mark_failed", job.key, error.as_dict())
        body = assemble.error_document(_source_section(job, None, None, None), error.as_dict(), attempts, time.time())
        try:
            if not isinstance(error, SourceGone):  # nothing to sit beside; the ledger re-admits it if it returns
                await asyncio.to_thread(self.sinks[job.source].write_error, job, body)
        except Exception as exc:
            log.error("error_sidecar_failed", kind=classify(exc).kind, error=str(exc))
        await self.sources[job.source].finish(job, "failed")

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.close()
        await self.supervisor.close()


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _changed(path: Path, before: tuple[int, int]) -> bool:
    try:
        return _stat_key(path) != before
    except OSError:
        return True


def _reset_private_dir(path: Path) -> None:
    """Empty ``path`` and (re)create it with mode 0700, whatever mode it had."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def _recorded_fingerprint(recorded: dict[str, Any]) -> Fingerprint:
    return Fingerprint(
        size=int(recorded.get("bytes") or 0), mtime_ns=None, sha256=recorded.get("sha256"),
        etag=recorded.get("etag"), version_id=recorded.get("version_id"),
    )


def _source_section(job: Job, path: Path | None, digest: str | None, mime: str | None) -> dict[str, Any]:
    origin = job.origin
    section: dict[str, Any] = {"uri": origin.uri, "name": origin.name, "bytes": 0, "sha256": digest}
    if isinstance(origin, S3Object):
        section |= {"bytes": origin.size or 0, "etag": origin.etag, "version_id": origin.version_id}
    if path is not None:
        try:
            stat = path.stat()
            section["bytes"] = stat.st_size
            if isinstance(origin, LocalFile):
                section["mtime"] = assemble.iso(stat.st_mtime)
        except OSError:
            pass
    elif isinstance(origin, LocalFile):
        try:
            section["bytes"] = origin.path.lstat().st_size
        except OSError:
            pass
    if mime:
        section["mime"] = mime
    return section


# --- systemd ------------------------------------------------------------------------------------------------


def sd_notify(message: str) -> bool:
    """Send one notification to systemd when ``NOTIFY_SOCKET`` is set; silently a no-op otherwise."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify_failed", error=str(exc))
        return False
    return True


# --- the daemon ---------------------------------------------------------------------------------------------


class Daemon:
    def __init__(self, cfg: Config, config_path: Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.metrics = Metrics()
        self.lag_probe = LoopLagProbe(self.metrics)
        self.ledger: Ledger | None = None
        self.pipeline: Pipeline | None = None
        self.health: HealthServer | None = None
        self.local: Any = None
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._ready = False
        self._interrupts = 0
        self._background: list[asyncio.Task[None]] = []

    async def serve(self) -> int:
        try:
            await self.startup()
            await self.main_loop()
        finally:
            await self.shutdown()
        return 0

    # --- start-up ---------------------------------------------------------------------------------------------

    async def startup(self) -> None:
        cfg = self.cfg
        self._install_signals()
        self._background.append(asyncio.create_task(self.lag_probe.run(), name="loop-lag-probe"))
        cfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock_state_dir()
        _reset_private_dir(cfg.state_dir / "tmp")  # what sessions killed with the last process left behind
        self.ledger = Ledger(cfg.state_dir / "ledger.sqlite3")
        if cfg.metrics.enabled:
            self.health = HealthServer(self.metrics, cfg.metrics.listen, lambda: self._ready, self._update_gauges)
            await self.health.start()
        self.pipeline = Pipeline(cfg, self.ledger, self.metrics)
        await self.pipeline.start()
        self._add_sources()
        resumed = self._resume()
        for source in self.pipeline.sources.values():
            await source.start(self.pipeline.submit)
        self._ready = True
        sd_notify("READY=1")
        self._background.append(asyncio.create_task(self._health_tick()))
        log.info("daemon_ready", inboxes=[str(i.path) for i in cfg.inbox], s3=len(cfg.s3), resumed=resumed)

    def _add_sources(self) -> None:
        from ocrwatch.sources.local import LocalSource

        assert self.pipeline is not None
        cfg = self.cfg
        self.local = LocalSource(cfg.inbox, reconcile_seconds=cfg.daemon.reconcile_seconds, name_template=cfg.output.name_template)
        self.pipeline.add_source(self.local, LocalSink(cfg.output.name_template, cfg.output.dir))
        if cfg.s3:
            from ocrwatch.sinks.s3 import S3Sink
            from ocrwatch.sources.s3 import S3Source

            for index, s3cfg in enumerate(cfg.s3):
                source = S3Source(
                    s3cfg, name=f"s3:{index}", limits=cfg.limits, name_template=cfg.output.name_template,
                    max_inflight=self.pipeline.active_documents,
                )
                self.pipeline.add_source(source, S3Sink(s3cfg, source.client, cfg.output.name_template))

    def _lock_state_dir(self) -> None:
        """One daemon per state directory: a second would process every document twice. Released by the kernel
        whenever this process ends, ``kill -9`` included."""
        path = self.cfg.state_dir / "daemon.lock"
        self._state_lock = open(path, "a")  # noqa: SIM115 - held for the life of the process
        try:
            fcntl.flock(self._state_lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._state_lock.close()
            raise ConfigError(
                f"state_dir: {self.cfg.state_dir} is in use by another running ocrwatch",
                hint="stop the other daemon, or give this one its own state_dir",
            ) from None

    def _resume(self) -> int:
        assert self.ledger is not None and self.pipeline is not None
        count = 0
        for row in self.ledger.unfinished():
            if row.job.source not in self.pipeline.sources:
                continue
            if row.state == "writing" and self._already_written(row.job, row.fingerprint):
                self.ledger.mark_done(row.key)  # killed between the sidecars and the ledger: nothing to redo
                continue
            self.pipeline.start_job(row.job)
            count += 1
        return count

    def _already_written(self, job: Job, fingerprint: Fingerprint) -> bool:
        assert self.pipeline is not None
        recorded = self.pipeline.sinks[job.source].recorded(job)
        return recorded is not None and same_content(_recorded_fingerprint(recorded), fingerprint)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)

    def _on_stop_signal(self, name: str) -> None:
        self._interrupts += 1
        if self._interrupts > 1 and name == "SIGINT":
            log.warning("forced_exit")
            os._exit(130)
        self._stop.set()

    # --- running ----------------------------------------------------------------------------------------------

    async def main_loop(self) -> None:
        while not self._stop.is_set():
            stop = asyncio.create_task(self._stop.wait())
            reload = asyncio.create_task(self._reload.wait())
            await asyncio.wait({stop, reload}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            reload.cancel()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                await self.reload()

    async def reload(self) -> None:
        """SIGHUP: re-read the file; inboxes are added or removed live, other changes need a restart."""
        sd_notify("RELOADING=1")
        try:
            new = config_module.load(self.config_path)
        except OcrwatchError as exc:
            log.error("reload_failed", kind=exc.kind, error=exc.message)
            sd_notify("READY=1")
            return
        try:
            await self.local.update_inboxes(new.inbox)
        except OcrwatchError as exc:
            log.error("reload_failed", kind=exc.kind, error=exc.message)
            sd_notify("READY=1")
            return
        changed = [
            name for name in type(new).model_fields if name != "inbox" and getattr(new, name) != getattr(self.cfg, name)
        ]
        self.cfg = self.cfg.model_copy(update={"inbox": new.inbox})
        if changed:
            log.warning("reload_needs_restart", keys=changed)
        log.info("config_reloaded", inboxes=[str(i.path) for i in new.inbox])
        sd_notify("READY=1")

    async def _health_tick(self) -> None:
        interval = self.cfg.daemon.health_interval_seconds
        watchdog_usec = os.environ.get("WATCHDOG_USEC")
        if watchdog_usec:
            interval = min(interval, int(watchdog_usec) / 2e6)
        while True:
            start = time.monotonic()
            await asyncio.sleep(interval)
            lag = time.monotonic() - start - interval
            self.metrics.loop_lag.set(max(self.lag_probe.take_worst(), lag, 0.0))
            self._update_gauges()
            if lag < max(interval, 1.0):
                sd_notify("WATCHDOG=1")

    def _update_gauges(self) -> None:
        if self.pipeline is not None:  # None while the engine warms up: /metrics already answers then
            self.pipeline.update_gauges()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            self.metrics.gpu_memory.set(torch.cuda.memory_allocated())

    # --- shutdown ---------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        sd_notify("STOPPING=1")
        self._ready = False
        log.info("daemon_stopping")
        if self.pipeline is not None:
            for source in self.pipeline.sources.values():
                try:
                    await source.stop()
                except Exception as exc:
                    log.warning("source_stop_failed", source=source.name, error=str(exc))
            interrupted = await self.pipeline.drain(self.cfg.daemon.shutdown_timeout)
            if interrupted:
                log.warning("jobs_requeued_at_shutdown", jobs=interrupted)
            await self.pipeline.close()
        for task in self._background:
            task.cancel()
        if self.health is not None:
            await self.health.stop()
        if self.ledger is not None:
            self.ledger.close()
        log.info("daemon_stopped")


async def ocr_files(
    cfg: Config, paths: Iterable[Path], *, on_done: Callable[[Job, str], None] | None = None
) -> list[tuple[Job, str]]:
    """One-shot OCR of the given files (``ocrwatch ocr``): the same pipeline, no ledger and no watching."""
    from ocrwatch.sources.files import GivenFiles

    pipeline = Pipeline(cfg, None, Metrics())
    await pipeline.start()
    source = GivenFiles(list(paths))
    pipeline.add_source(source, LocalSink(cfg.output.name_template, cfg.output.dir))
    results: list[tuple[Job, str]] = []  # here, not in the pipeline: a daemon's pipeline would keep every job
    try:
        tasks = [(job, pipeline.start_job(job)) for job in source.jobs()]
        for job, task in tasks:
            status = await task
            results.append((job, status))
            if on_done is not None:
                on_done(job, status)
        return results
    finally:
        await pipeline.close()
