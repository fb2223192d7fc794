"""Pages/s of the daemon (inbox → sidecars) against a naive loop, on the same pages with the same
Tesseract.

(a) ``ocrwatch run`` as a process: every document is dropped into its inbox at once; the clock runs
from the first drop to the last JSON sidecar. Daemon start-up (engine warm-up) is outside the clock.
(b) the naive loop: for each document, probe it, render a page, OCR it, next page, then write the
Markdown and JSON; one page at a time, the same renderer, render spec and ``TesseractEngine``, in
this process.

Runs alternate (a, b, b, a, ...) so that drift of the machine hits both sides alike. Target on 2
cores: a/b ≥ 1.5.

    python bench/pipeline.py [--pages 40] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Daemon, Doc, corpus_documents, drop, emit, machine, median, sidecar, wait_for

from ocrwatch.config import Config, LogConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.infra import logging
from ocrwatch.pages import render


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_daemon(docs: list[Doc], scratch: Path) -> dict[str, Any]:
    """CPU: the daemon and its children, counted once it has exited (its engine warm-up
    included)."""
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    with Daemon(scratch) as daemon:
        started = time.monotonic()
        dropped = [drop(doc.path, daemon.inbox) for doc in docs]
        wait_for(
            lambda: all(sidecar(path).exists() for path in dropped),
            1800,
            "every sidecar",
            interval=0.05,
        )
        seconds = time.monotonic() - started
        metrics = daemon.metrics()
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    pages = sum(doc.pages for doc in docs)
    workers = os.cpu_count() or 1  # [engine.tesseract] workers = 0: one per core
    recognize = metrics.get('ocrwatch_stage_seconds_sum{stage="recognize"}', 0.0)
    return {
        "seconds": round(seconds, 2),
        "pages_per_s": round(pages / seconds, 3),
        "render_seconds": round(metrics.get('ocrwatch_stage_seconds_sum{stage="render"}', 0.0), 2),
        "recognize_seconds": round(recognize, 2),
        "engine_busy": round(recognize / (seconds * workers), 3),
        "cpu_s_per_page": round(cpu / pages, 3),
        "max_loop_lag_s": round(metrics["ocrwatch_event_loop_max_lag_seconds"], 4),
    }


async def _naive(docs: list[Doc], out: Path) -> None:
    cfg = Config()
    engine = TesseractEngine(cfg.engine.tesseract)
    await engine.start()
    spec = render.render_spec(cfg.render, engine.geometry)
    limits = render.Limits.from_config(cfg.limits)
    try:
        for doc in docs:
            info = render.probe(doc.path, limits)
            pages = []
            for page in render.iter_pages(doc.path, info, spec):
                request = PageRequest(
                    request_id=f"{doc.path.name}/p{page.index}", image=page.image, prompt=""
                )
                pages.append((await engine.recognize(request)).markdown)
            target = out / doc.path.name
            target.with_name(target.name + ".md").write_text(
                "".join(f"<!-- page {n} -->\n{text}\n\n" for n, text in enumerate(pages, 1))
            )
            sidecar(target).write_text(json.dumps({"source": str(doc.path), "pages": pages}))
    finally:
        await engine.close()


def run_naive(docs: list[Doc], scratch: Path) -> dict[str, Any]:
    scratch.mkdir(parents=True, exist_ok=True)
    cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    asyncio.run(_naive(docs, scratch))
    seconds = time.monotonic() - started
    cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    pages = sum(doc.pages for doc in docs)
    return {
        "seconds": round(seconds, 2),
        "pages_per_s": round(pages / seconds, 3),
        "cpu_s_per_page": round(cpu / pages, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pages", type=int, default=40, help="corpus pages (whole documents, up to this many)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, interleaved")
    args = parser.parse_args()
    # the naive loop's engine logs like the daemon's, quietly
    logging.configure(LogConfig(level="warning"))
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as tmp:
        scratch = Path(tmp)
        docs, origin = corpus_documents(args.pages, scratch / "generated")
        pages = sum(doc.pages for doc in docs)
        print(f"{pages} pages in {len(docs)} documents from {origin}", flush=True)
        daemon_runs, naive_runs = [], []
        for number in range(args.rounds):
            order = ("daemon", "naive") if number % 2 == 0 else ("naive", "daemon")
            for side in order:
                folder = scratch / f"{side}-{number}"
                if side == "daemon":
                    daemon_runs.append(run_daemon(docs, folder))
                    print(f"round {number} daemon: {daemon_runs[-1]}", flush=True)
                else:
                    naive_runs.append(run_naive(docs, folder))
                    print(f"round {number} naive:  {naive_runs[-1]}", flush=True)
    daemon_rate = median(run["pages_per_s"] for run in daemon_runs)
    naive_rate = median(run["pages_per_s"] for run in naive_runs)
    print(
        f"daemon {daemon_rate:.3f} pages/s, naive {naive_rate:.3f} pages/s, ratio "
        f"{daemon_rate / naive_rate:.2f}"
    )
    emit(
        {
            "bench": "pipeline",
            "pages": pages,
            "documents": len(docs),
            "corpus": origin,
            "daemon_pages_per_s": daemon_rate,
            "naive_pages_per_s": naive_rate,
            "ratio": round(daemon_rate / naive_rate, 3),
            "target_ratio": 1.5,
            "daemon_runs": daemon_runs,
            "naive_runs": naive_runs,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
