"""Metrics and health endpoints: the HTTP server in-process, then the real daemon scraped over
HTTP."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ocrwatch.infra.metrics import QUEUES, STAGES, HealthServer, LoopLagProbe, Metrics
from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until
from tests.support import docs

Samples = dict[str, float]


def parse(text: str) -> Samples:
    """``name{a="1",b="2"}`` (labels sorted) → value, for every sample."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# --- in-process -----------------------------------------------------------------------------------


async def test_health_server_paths_and_refresh_before_each_scrape() -> None:
    metrics = Metrics()
    scrapes = 0

    def refresh() -> None:
        nonlocal scrapes
        scrapes += 1
        metrics.inflight_pages.set(scrapes)

    server = HealthServer(metrics, "127.0.0.1:0", refresh)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert await asyncio.to_thread(status_of, f"{base}/healthz") == 200
        assert await asyncio.to_thread(status_of, f"{base}/readyz") == 503
        server.set_ready(True)
        assert await asyncio.to_thread(status_of, f"{base}/readyz") == 200
        assert await asyncio.to_thread(status_of, f"{base}/nope") == 404
        for expected in (1, 2):
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"{base}/metrics", timeout=5).read()
            )
            assert parse(body.decode())["ocrwatch_inflight_pages"] == expected
    finally:
        await server.stop()


async def test_readyz_says_not_ready_while_admission_is_stuck_and_why() -> None:
    stuck = "no file fingerprinted for 130 s while 8 wait"
    server = HealthServer(Metrics(), "127.0.0.1:0")
    await server.start()
    base = f"http://127.0.0.1:{server.port}"

    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready_gauge() -> float:
        body = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        return parse(body)["ocrwatch_ready"]

    try:
        server.set_ready(True)
        server.set_stuck(stuck)
        assert await asyncio.to_thread(readyz) == (503, f"not ready: {stuck}\n")
        assert await asyncio.to_thread(ready_gauge) == 0.0
        assert await asyncio.to_thread(status_of, f"{base}/healthz") == 200  # the loop turns
        server.set_stuck(None)
        assert await asyncio.to_thread(readyz) == (200, "ready\n")
        assert await asyncio.to_thread(ready_gauge) == 1.0
    finally:
        await server.stop()


async def test_metrics_speak_openmetrics_when_asked_and_answer_head() -> None:
    server = HealthServer(Metrics(), "127.0.0.1:0")
    await server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"

    def fetch(method: str = "GET", accept: str | None = None) -> tuple[str, bytes]:
        request = urllib.request.Request(
            url, method=method, headers={"Accept": accept} if accept else {}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.headers["Content-Type"], response.read()

    try:
        plain_type, plain = await asyncio.to_thread(fetch)
        assert plain_type.startswith("text/plain") and b"ocrwatch_documents_total" in plain
        open_type, openmetrics = await asyncio.to_thread(
            fetch, accept="application/openmetrics-text; version=1.0.0"
        )
        assert open_type.startswith("application/openmetrics-text") and openmetrics.endswith(
            b"# EOF\n"
        )
        assert await asyncio.to_thread(fetch, "HEAD") == (plain_type, b"")
    finally:
        await server.stop()


def test_every_series_exists_before_the_first_document() -> None:
    samples = parse(Metrics().render().decode())
    for stage in STAGES:
        assert samples[f'ocrwatch_stage_seconds_count{{stage="{stage}"}}'] == 0
    for stage in QUEUES:
        assert samples[f'ocrwatch_queue_depth{{stage="{stage}"}}'] == 0
    for status in ("ok", "partial", "failed"):
        assert samples[f'ocrwatch_documents_total{{status="{status}"}}'] == 0
    for stage in ("document", "page", "engine"):
        assert samples[f'ocrwatch_retries_total{{stage="{stage}"}}'] == 0


async def test_loop_lag_probe_sees_a_blocking_call() -> None:
    metrics = Metrics()
    probe = LoopLagProbe(metrics, interval=0.01)
    task = asyncio.create_task(probe.run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # what the probe exists to catch: the loop held by synchronous work
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
    worst = probe.take_worst()
    assert worst >= 0.25
    assert parse(metrics.render().decode())["ocrwatch_event_loop_max_lag_seconds"] == worst
    assert probe.take_worst() == 0.0  # taken: the next health interval starts afresh


# --- the real daemon ------------------------------------------------------------------------------


def drop(source: Path, inbox: Path) -> Path:
    target = inbox / source.name
    os.replace(source, target)
    return target


@pytest.mark.integration
def test_daemon_metrics_follow_a_document_through_every_stage(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d").start()  # start() waits for /readyz 200
    try:
        base = f"http://127.0.0.1:{daemon.port}"
        assert status_of(f"{base}/readyz") == 200
        assert status_of(f"{base}/healthz") == 200
        idle = parse(daemon.metrics())
        assert idle['ocrwatch_documents_total{status="ok"}'] == 0
        assert idle["ocrwatch_oldest_waiting_seconds"] == 0

        pages = [
            [f"Metrics page {n}", "Quarterly report invoice", "number forty two"] for n in range(8)
        ]
        pdf = drop(docs.write_pdf(tmp_path / "eight.pdf", pages), daemon.inbox)

        def busy() -> Samples | None:
            samples = parse(daemon.metrics())
            return (
                samples
                if samples['ocrwatch_active_documents{state="running"}'] == 1
                and samples["ocrwatch_inflight_pages"] > 0
                else None
            )

        during = wait_until(busy, 60, "a scrape while pages are in the engine", interval=0.02)
        assert during["ocrwatch_oldest_waiting_seconds"] > 0
        assert sum(during[f'ocrwatch_queue_depth{{stage="{stage}"}}'] for stage in QUEUES) > 0

        wait_until(lambda: sidecars_done(pdf), 120, "the sidecars")
        done = wait_until(
            lambda: (
                (s := parse(daemon.metrics()))['ocrwatch_documents_total{status="ok"}'] == 1 and s
            ),
            10,
            "the document counted",
        )
        assert done['ocrwatch_pages_total{status="ok"}'] == 8
        assert done['ocrwatch_pages_total{status="failed"}'] == 0
        for stage in ("render", "recognize"):
            assert done[f'ocrwatch_stage_seconds_count{{stage="{stage}"}}'] == 8
            assert done[f'ocrwatch_stage_seconds_sum{{stage="{stage}"}}'] > 0
        for stage in ("waiting", "fetch_probe", "pages", "write", "end_to_end"):
            assert done[f'ocrwatch_stage_seconds_count{{stage="{stage}"}}'] == 1
        assert done['ocrwatch_stage_seconds_sum{stage="write"}'] > 0
        end_to_end, pages_stage = (
            done[f'ocrwatch_stage_seconds_sum{{stage="{s}"}}'] for s in ("end_to_end", "pages")
        )
        assert end_to_end >= pages_stage
        for stage in QUEUES:
            assert done[f'ocrwatch_queue_depth{{stage="{stage}"}}'] == 0
        assert done["ocrwatch_inflight_pages"] == 0
        assert done['ocrwatch_active_documents{state="running"}'] == 0
        assert done['ocrwatch_active_documents{state="waiting"}'] == 0
        assert done["ocrwatch_oldest_waiting_seconds"] == 0
        assert done['ocrwatch_tokens_total{kind="prompt"}'] == 0  # Tesseract reports no tokens
        for phase in ("queue", "encode", "ocr"):  # Tesseract's phases, one observation per page
            assert done[f'ocrwatch_engine_seconds_count{{phase="{phase}"}}'] == 8
        assert done['ocrwatch_engine_seconds_sum{phase="ocr"}'] > 0
        assert done['ocrwatch_engine_seconds_count{phase="decode"}'] == 0
        for stage in ("document", "page", "engine"):
            assert done[f'ocrwatch_retries_total{{stage="{stage}"}}'] == 0
        assert done["ocrwatch_event_loop_max_lag_seconds"] >= 0
        assert done["ocrwatch_event_loop_lag_seconds"] >= 0
        # no GPU, no series
        assert not [name for name in done if name.startswith("ocrwatch_gpu_memory_bytes")]
        assert done["ocrwatch_ready"] == 1
        assert done["process_open_fds"] > 0 and done["process_resident_memory_bytes"] > 0
        assert [name for name in done if name.startswith("ocrwatch_build_info{")]

        bad = drop(docs.write_corrupt_pdf(tmp_path / "bad.pdf"), daemon.inbox)
        wait_until(lambda: bad.with_name("bad.pdf.error.json").exists(), 60, "the error sidecar")
        failed = wait_until(
            lambda: (
                (s := parse(daemon.metrics()))['ocrwatch_documents_total{status="failed"}'] == 1
                and s
            ),
            10,
            "the failure counted",
        )
        assert failed['ocrwatch_documents_total{status="ok"}'] == 1
    finally:
        assert daemon.stop() == 0
