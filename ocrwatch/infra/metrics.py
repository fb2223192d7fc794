"""Prometheus metrics and the health endpoints, served on loopback by default.

The registry is created at start-up (never at import) and passed to whoever records. ``/healthz``
answers 200 while the event loop turns (the request itself proves it); ``/readyz`` answers 200 only
once the engine is warm and the sources are watching, and not while admission is stuck (files wait
for their fingerprint and none comes out: a filesystem that hangs), which its body then names.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable

import structlog
from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder

from ocrwatch import __version__
from ocrwatch.infra.http import Listener

log = structlog.get_logger()

_STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)

STAGES = ("waiting", "fetch_probe", "render", "recognize", "pages", "write", "end_to_end")
"""Latency stages: detected → started (``waiting``), the document's fetch and probe, each page's
render and recognition, all of a document's pages, writing the sidecars, and detected → sidecars
(``end_to_end``)."""

ENGINE_PHASES = ("prepare", "queue", "first_token", "decode", "total", "encode", "ocr")
"""Where a recognition's time went, as the engine reports it (``Recognition.timings``): vLLM prepare
(input processing), queue (waiting for a batch slot), first_token, decode, total; Tesseract queue,
encode, ocr."""

QUEUES = ("render_queue", "rendering", "ready", "inflight")
"""Pages not yet rendered, being rendered, rendered and waiting for the engine, inside the
engine."""

AMQP_EVENTS = ("received", "redelivered", "acknowledged", "requeued", "dead_lettered")
"""What became of the messages of an AMQP source: taken from the queue (a redelivered one counts in
both), acknowledged (done, or of no use), put back, dead-lettered."""


class Metrics:
    """Every series is created here with its labels, so a scrape shows zeros before the first
    document."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.documents = Counter(
            "ocrwatch_documents", "Documents finished, by status", ["status"], registry=r
        )
        self.pages = Counter(
            "ocrwatch_pages", "Pages recognised, by status", ["status"], registry=r
        )
        self.stage_seconds = Histogram(
            "ocrwatch_stage_seconds",
            "Latency per stage",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            "ocrwatch_engine_seconds",
            "Time inside the engine per recognition, by phase",
            ["phase"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "ocrwatch_queue_depth", "Pages waiting per stage", ["stage"], registry=r
        )
        self.active_documents = Gauge(
            "ocrwatch_active_documents",
            "Documents admitted: waiting for a slot, or running",
            ["state"],
            registry=r,
        )
        self.oldest_waiting = Gauge(
            "ocrwatch_oldest_waiting_seconds",
            "Age of the oldest unfinished job, since it was detected",
            registry=r,
        )
        self.inflight_pages = Gauge(
            "ocrwatch_inflight_pages", "Pages inside the engine", registry=r
        )
        self.tokens = Counter("ocrwatch_tokens", "Tokens processed", ["kind"], registry=r)
        self.retries = Counter("ocrwatch_retries", "Retries, by stage", ["stage"], registry=r)
        self.loop_lag = Gauge(
            "ocrwatch_event_loop_lag_seconds",
            "Worst event-loop lag during the last health interval",
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "ocrwatch_event_loop_max_lag_seconds", "Worst event-loop lag since start", registry=r
        )
        self.gpu_memory = Gauge(
            "ocrwatch_gpu_memory_bytes",
            "GPU memory in use on each GPU (every process, the engine core's too)",
            ["gpu"],
            registry=r,
        )
        self.ready = Gauge(
            "ocrwatch_ready",
            "1 once the engine is warm and the sources watch, and while admission is not stuck,"
            " as /readyz",
            registry=r,
        )
        self.build_info = Gauge(
            "ocrwatch_build_info",
            "Always 1; the labels say which ocrwatch runs",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        # process_*: resident memory, CPU, open descriptors, as exporters have
        ProcessCollector(registry=r)
        self.engine_restarts = Counter(
            "ocrwatch_engine_restarts", "Engine rebuilds after a death", registry=r
        )
        # Local inboxes, labelled by folder (``sources.local`` creates each inbox's series as it
        # watches it).
        self.inbox_watcher_restarts = Counter(
            "ocrwatch_inbox_watcher_restarts",
            "Inbox watchers found dead (a thread ended, the folder replaced) "
            "and started again, by inbox",
            ["inbox"],
            registry=r,
        )
        self.inbox_event_overflows = Counter(
            "ocrwatch_inbox_event_overflows",
            "Times an inbox's events were dropped (the kernel's queue full, or "
            "more waiting than the loop took) and a scan looked instead, by inbox",
            ["inbox"],
            registry=r,
        )
        # Completion hooks: labelled by the [[hook]] names, which ``hooks.HookRunner`` creates.
        self.hook_deliveries = Counter(
            "ocrwatch_hook_deliveries",
            "Hook deliveries finished, by hook and outcome (delivered, failed)",
            ["hook", "outcome"],
            registry=r,
        )
        self.hook_attempts = Counter(
            "ocrwatch_hook_attempts",
            "Hook attempts, by hook and result (ok, error)",
            ["hook", "result"],
            registry=r,
        )
        self.hook_pending = Gauge(
            "ocrwatch_hook_pending", "Hook deliveries waiting or running", ["hook"], registry=r
        )
        # What became of sources once done (``[output] on_success``): a failure leaves the source
        # where it was.
        self.archived = Counter(
            "ocrwatch_sources_archived",
            "Sources moved or deleted once ok, by action (move, delete)",
            ["action"],
            registry=r,
        )
        self.archive_failures = Counter(
            "ocrwatch_source_archive_failures",
            "Sources left in place although on_success asked otherwise, by "
            "action and reason (changed: not the bytes read; error: the move or delete failed)",
            ["action", "reason"],
            registry=r,
        )
        # S3 sources with transport "amqp", labelled by source name (``sources.amqp`` creates them).
        self.amqp_messages = Counter(
            "ocrwatch_amqp_messages",
            "Messages of an AMQP source, by source and event (AMQP_EVENTS)",
            ["source", "event"],
            registry=r,
        )
        self.amqp_connected = Gauge(
            "ocrwatch_amqp_connected",
            "1 while an AMQP source is connected and consuming",
            ["source"],
            registry=r,
        )
        for status in ("ok", "partial", "failed"):
            self.documents.labels(status=status)
        for status in ("ok", "failed"):
            self.pages.labels(status=status)
        for stage in STAGES:
            self.stage_seconds.labels(stage=stage)
        for phase in ENGINE_PHASES:
            self.engine_seconds.labels(phase=phase)
        for stage in QUEUES:
            self.queue_depth.labels(stage=stage)
        for state in ("waiting", "running"):
            self.active_documents.labels(state=state)
        for kind in ("prompt", "completion"):
            self.tokens.labels(kind=kind)
        for stage in ("document", "page", "engine"):
            self.retries.labels(stage=stage)
        for action in ("move", "delete"):
            self.archived.labels(action=action)
            for reason in ("changed", "error"):
                self.archive_failures.labels(action=action, reason=reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopLagProbe:
    """Wakes every ``interval`` and measures how late it woke: a blocking call anywhere on the loop
    shows up, even one far shorter than the health interval."""

    def __init__(self, metrics: Metrics, interval: float = 0.1) -> None:
        self._metrics = metrics
        self._interval = interval
        self._worst = 0.0
        self._max = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self._interval)
            lag = max(loop.time() - start - self._interval, 0.0)
            self._worst = max(self._worst, lag)
            if lag > self._max:
                self._max = lag
                self._metrics.loop_lag_max.set(lag)

    def take_worst(self) -> float:
        """The worst lag since the previous call (the health tick's interval)."""
        worst, self._worst = self._worst, 0.0
        return worst


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``listen``, through ``ocrwatch.infra.http``.

    ``/metrics`` speaks whatever format the scraper's ``Accept`` asks for (Prometheus text or
    OpenMetrics), through prometheus_client's own exposition. ``update_gauges`` runs before each
    /metrics answer, on the loop, so gauges read at scrape time are exact rather than a tick old; it
    must be cheap. ``/readyz`` says what ``set_ready`` last said (not ready until then), unless
    ``set_stuck`` last named why the daemon takes no work now.
    """

    def __init__(
        self,
        metrics: Metrics,
        listen: str,
        update_gauges: Callable[[], None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._ready = False
        self._stuck: str | None = None
        self._update_gauges = update_gauges
        metrics.ready.set(0)
        app = web.Application()
        app.router.add_get("/metrics", self._scrape)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._listener = Listener(
            app, listen, name="metrics", max_connections=32, idle_timeout=10.0
        )

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address

    def set_ready(self, ready: bool) -> None:
        """Ready (the engine warm, the sources watching) or no longer (stopping)."""
        self._ready = ready
        self._metrics.ready.set(float(self.unready() is None))

    def set_stuck(self, why: str | None) -> None:
        """Why the daemon, though ready, takes no work now (admission stuck), or None: it does."""
        self._stuck = why
        self._metrics.ready.set(float(self.unready() is None))

    async def start(self) -> None:
        await self._listener.start()
        log.info("metrics_listening", host=self.address[0], port=self.port)

    async def stop(self) -> None:
        await self._listener.stop()

    def unready(self) -> str | None:
        """Why ``/readyz`` says not ready, or None when it says ready."""
        if not self._ready:
            return "not ready"
        return None if self._stuck is None else f"not ready: {self._stuck}"

    async def _scrape(self, request: web.Request) -> web.Response:
        if self._update_gauges is not None:
            self._update_gauges()
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encoder(self._metrics.registry), headers={"Content-Type": content_type}
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")  # answering at all proves the event loop turns

    async def _readyz(self, request: web.Request) -> web.Response:
        why = self.unready()
        if why is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"{why}\n")


def gpu_memory_used() -> dict[str, int]:
    """Bytes in use on each GPU the NVIDIA driver shows, read through NVML (``nvidia-ml-py``), which
    counts every process on the device, so the engine core's own process is included; empty without
    NVML or a GPU."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        return {
            str(index): int(
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used
            )
            for index in range(pynvml.nvmlDeviceGetCount())
        }
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()
