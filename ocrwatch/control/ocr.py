"""What an ``ocr`` request does, in the daemon or, when none runs, in the ``ocrwatch ocr`` process
itself with an engine of its own: its events are the same either way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ocrwatch.config import TextMode
from ocrwatch.control.protocol import REQUEST_PREFIX, Emit, OcrRequest
from ocrwatch.errors import OcrwatchError
from ocrwatch.jobs.jobrun import Asked
from ocrwatch.jobs.pipeline import Pipeline
from ocrwatch.safefs import TooLarge, hash_fd
from ocrwatch.sinks.base import recorded_fingerprint, records
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.sources.files import GivenFiles, open_named
from ocrwatch.store.ledger import Fingerprint

PROGRESS_SECONDS = 0.5

_requests = itertools.count(1)


async def run_ocr(
    pipeline: Pipeline,
    sink: LocalSink,
    files: list[tuple[Path, Path]],
    *,
    force: bool,
    emit: Emit,
    lang: str | None = None,
    before_first: Callable[[], Awaitable[None]] | None = None,
    accepting: Callable[[], bool] = lambda: True,
    text: TextMode | None = None,
) -> None:
    """OCR ``files`` through ``pipeline`` without the ledger, emitting each file's page progress and
    result.

    A file whose JSON sidecar records its very content is skipped unless ``force``; ``lang``:
    Tesseract's languages for these files, ``text``: where their pages' text comes from.
    ``before_first`` runs once, before the first job starts (a CLI's own engine is started only when
    something is left to do); ``accepting`` turns False when the daemon stops, and the files not
    started yet are reported interrupted. Cancelled (the client went away), it stops the jobs it
    started and returns once they have ended."""
    name = f"{REQUEST_PREFIX}{next(_requests)}"
    source = GivenFiles([path for path, _ in files])
    source.name = name
    pipeline.add_source(source, sink)
    waiting: dict[asyncio.Task[str], Job] = {}
    shown: dict[str, tuple[int, int]] = {}

    async def admit() -> None:
        started = False
        for path, root in files:
            job = Job(origin=LocalFile(path, root), source=name)
            budget = pipeline.cfg.limits.max_bytes  # these jobs carry no inbox's own
            if not force and await asyncio.to_thread(_current, sink, job, budget):
                await emit({"event": "result", "file": str(path), "status": "skipped"})
                continue
            if not started and before_first is not None:
                await before_first()
            started = True
            if not accepting():
                await emit(_interrupted(path))
                continue
            waiting[pipeline.start_job(job, Asked(lang, text))] = job

    admitting = asyncio.create_task(admit(), name=f"ocr-admit:{name}")
    try:
        while not admitting.done() or waiting:
            # only what can still finish: a done task in the set would end every wait at once
            pending: set[asyncio.Task[Any]] = set(waiting)
            if not admitting.done():
                pending.add(admitting)
            await asyncio.wait(
                pending, timeout=PROGRESS_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if admitting.done():
                # raises what stopped it (a file that cannot be checked, an engine that failed)
                admitting.result()
            await _emit_progress(pipeline, waiting, shown, emit)
            for task in [task for task in waiting if task.done()]:
                job = waiting.pop(task)
                done, total = shown.pop(job.key, (0, 0))
                if done < total and not task.cancelled() and task.result() != "failed":
                    # its last pages finished between two looks
                    await emit(_progress(job, total, total))
                await emit(await _outcome(sink, job, task))
    finally:
        admitting.cancel()
        mine = {p.job.key for p in pipeline.progress() if p.job.source == name}
        stopping = [task for task, job in waiting.items() if job.key in mine]
        for task in stopping:
            task.cancel()
        await asyncio.gather(admitting, *stopping, return_exceptions=True)
        pipeline.remove_source(name)  # none of its jobs runs any more


def _current(sink: LocalSink, job: Job, max_bytes: int) -> bool:
    """Whether the job's JSON sidecar records its content now (blocking: hashes the file, when a
    sidecar is there to compare with). Its size comes from ``fstat`` first, as admission's does: a
    file of another size than recorded, or over ``max_bytes``, is not read at all (a sparse terabyte
    costs a ``stat``), nor one read past that size. Anything that is not a regular file is left to
    the pipeline, which names what it is; it is never read here (a FIFO would block)."""
    assert isinstance(job.origin, LocalFile)
    if (recorded := sink.recorded(job)) is None:
        return False
    size = recorded_fingerprint(recorded).size
    try:
        fd, info = open_named(job.origin.path)
    except (OcrwatchError, OSError):  # left to the pipeline, which names what it is
        return False
    try:
        if info.st_size != size or size > max_bytes:
            return False
        try:
            digest = hash_fd(fd, limit=size)
        except TooLarge:  # written past it while read
            return False
    finally:
        os.close(fd)
    fingerprint = Fingerprint(size=info.st_size, mtime_ns=info.st_mtime_ns, sha256=digest)
    return records(recorded, fingerprint)


async def _emit_progress(
    pipeline: Pipeline,
    waiting: dict[asyncio.Task[str], Job],
    shown: dict[str, tuple[int, int]],
    emit: Emit,
) -> None:
    by_key = {p.job.key: p for p in pipeline.progress()}
    for job in waiting.values():
        now = by_key.get(job.key)
        if (
            now is None
            or now.pages_total is None
            or shown.get(job.key) == (now.pages_done, now.pages_total)
        ):
            continue
        shown[job.key] = (now.pages_done, now.pages_total)
        await emit(_progress(job, now.pages_done, now.pages_total))


async def _outcome(sink: LocalSink, job: Job, task: asyncio.Task[str]) -> dict[str, Any]:
    assert isinstance(job.origin, LocalFile)
    if task.cancelled():
        return _interrupted(job.origin.path)
    status = task.result()
    error = await asyncio.to_thread(_recorded_error, sink, job) if status == "failed" else None
    return {"event": "result", "file": str(job.origin.path), "status": status, "error": error}


def _progress(job: Job, done: int, total: int) -> dict[str, Any]:
    assert isinstance(job.origin, LocalFile)
    return {
        "event": "progress",
        "file": str(job.origin.path),
        "pages_done": done,
        "pages_total": total,
    }


def _interrupted(path: Path) -> dict[str, Any]:
    error = {
        "kind": "interrupted",
        "message": "the daemon stopped before it was done",
        "hint": "run it again",
    }
    return {"event": "result", "file": str(path), "status": "interrupted", "error": error}


def _recorded_error(sink: LocalSink, job: Job) -> dict[str, Any]:
    """The kind, message and hint of a failure, as its error sidecar records them."""
    try:
        error = json.loads(sink.paths(job)["error"].read_text())["error"]
        return {key: error[key] for key in ("kind", "message", "hint")}
    except (OSError, ValueError, KeyError, TypeError):
        return {
            "kind": "failed",
            "message": "no error sidecar could be read",
            "hint": "see the log",
        }


def declines(pipeline: Pipeline, order: OcrRequest) -> str | None:
    """Why the daemon's engine cannot serve a request (another engine asked for: ``--lang`` asks for
    Tesseract); None when it can. The client then reads the files with an engine of its own, which
    never means a second vLLM engine beside the daemon's: it is declined only for an engine the
    daemon does not run."""
    running = pipeline.supervisor.kind
    if order.engine is not None and order.engine != running:
        return f"the running daemon reads with {running}, not {order.engine}"
    return None
