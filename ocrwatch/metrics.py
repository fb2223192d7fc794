"""Prometheus metrics and the health endpoints, served on loopback by default.

The registry is created at start-up (never at import) and passed to whoever records. ``/healthz`` answers
200 while the event loop turns (the request itself proves it); ``/readyz`` answers 200 only once the engine is
warm and the sources are watching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = structlog.get_logger()

_STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)

STAGES = ("waiting", "fetch_probe", "render", "recognize", "pages", "write", "end_to_end")
"""Latency stages: detected → started (``waiting``), the document's fetch and probe, each page's render and
recognition, all of a document's pages, writing the sidecars, and detected → sidecars (``end_to_end``)."""

ENGINE_PHASES = ("prepare", "queue", "first_token", "decode", "total", "encode", "ocr")
"""Where a recognition's time went, as the engine reports it (``Recognition.timings``): vLLM prepare (input
processing), queue (waiting for a batch slot), first_token, decode, total; Tesseract queue, encode, ocr."""

QUEUES = ("render_queue", "rendering", "ready", "inflight")
"""Pages not yet rendered, being rendered, rendered and waiting for the engine, inside the engine."""


class Metrics:
    """Every series is created here with its labels, so a scrape shows zeros before the first document."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.documents = Counter("ocrwatch_documents", "Documents finished, by status", ["status"], registry=r)
        self.pages = Counter("ocrwatch_pages", "Pages recognised, by status", ["status"], registry=r)
        self.stage_seconds = Histogram(
            "ocrwatch_stage_seconds", "Latency per stage", ["stage"], buckets=_STAGE_BUCKETS, registry=r
        )
        self.engine_seconds = Histogram(
            "ocrwatch_engine_seconds", "Time inside the engine per recognition, by phase", ["phase"],
            buckets=_STAGE_BUCKETS, registry=r,
        )
        self.queue_depth = Gauge("ocrwatch_queue_depth", "Pages waiting per stage", ["stage"], registry=r)
        self.active_documents = Gauge(
            "ocrwatch_active_documents", "Documents admitted: waiting for a slot, or running", ["state"], registry=r
        )
        self.oldest_waiting = Gauge(
            "ocrwatch_oldest_waiting_seconds", "Age of the oldest unfinished job, since it was detected", registry=r
        )
        self.inflight_pages = Gauge("ocrwatch_inflight_pages", "Pages inside the engine", registry=r)
        self.tokens = Counter("ocrwatch_tokens", "Tokens processed", ["kind"], registry=r)
        self.retries = Counter("ocrwatch_retries", "Retries, by stage", ["stage"], registry=r)
        self.loop_lag = Gauge(
            "ocrwatch_event_loop_lag_seconds", "Worst event-loop lag during the last health interval", registry=r
        )
        self.loop_lag_max = Gauge(
            "ocrwatch_event_loop_max_lag_seconds", "Worst event-loop lag since start", registry=r
        )
        self.gpu_memory = Gauge("ocrwatch_gpu_memory_bytes", "GPU memory allocated by this process", registry=r)
        self.engine_restarts = Counter("ocrwatch_engine_restarts", "Engine rebuilds after a death", registry=r)
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

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopLagProbe:
    """Wakes every ``interval`` and measures how late it woke: a blocking call anywhere on the loop shows up,
    even one far shorter than the health interval."""

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
    """A deliberately tiny HTTP/1.0 server: three GET paths, nothing else, so it needs no dependency.

    ``refresh`` runs before each /metrics answer, on the loop, so it must be cheap."""

    def __init__(
        self, metrics: Metrics, listen: str, ready: Callable[[], bool], refresh: Callable[[], None] | None = None
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._host = host.strip("[]") or "127.0.0.1"
        self._port = int(port)
        self._metrics = metrics
        self._ready = ready
        self._refresh = refresh
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("metrics_listening", host=self._host, port=self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 and parts[0] == "GET" else ""
            if path == "/metrics":
                if self._refresh is not None:  # gauges read at scrape time are exact, not a tick old
                    self._refresh()
                status, body, ctype = 200, self._metrics.render(), CONTENT_TYPE_LATEST
            elif path == "/healthz":
                status, body, ctype = 200, b"ok\n", "text/plain"
            elif path == "/readyz":
                ready = self._ready()
                status, body, ctype = (200, b"ready\n", "text/plain") if ready else (503, b"not ready\n", "text/plain")
            else:
                status, body, ctype = 404, b"not found\n", "text/plain"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            head = f"HTTP/1.0 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
