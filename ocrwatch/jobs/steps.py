"""The document steps that need no pipeline state: fetch and probe, provenance, the JSON sidecar.

``Pipeline._process`` calls them in order; each takes what it reads (the config, the job's source,
the engine) rather than the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrwatch.config import Config, Format
from ocrwatch.engines.base import Engine
from ocrwatch.errors import OcrwatchError
from ocrwatch.jobs.admission import job_id
from ocrwatch.jobs.jobrun import JobRun
from ocrwatch.pages import render
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.results import assemble
from ocrwatch.results import further as outputs
from ocrwatch.safefs import Access
from ocrwatch.sources.base import Bucketed, Job, LocalFile, Origin, Read, S3Object, Source
from ocrwatch.store.ledger import sha256_file

__all__ = [
    "Probed",
    "assemble_document",
    "fetch_and_probe",
    "job_formats",
    "job_lang",
    "naming",
    "provenance",
    "timed",
]


@dataclass(frozen=True)
class Probed:
    """A fetched document, measured: what the later steps need to know before a page is rendered."""

    path: Path  # the job's private copy (or download): what is rendered and hashed
    changed: Callable[[], bool]  # blocking: whether the source no longer holds the version fetched
    info: render.DocumentInfo
    spec: render.RenderSpec
    sha256: str
    access: Access | None = None  # who may read the local source: its outputs get no more
    read: Read | None = None  # admission's hash of a local source (the archive reads it no more)


async def fetch_and_probe(
    cfg: Config, source: Source, run: JobRun, spool_dir: Path, engine: Engine
) -> Probed:
    """The document as a file private to the job, held to the limits and measured, so a document
    that cannot be done fails before its first page is rendered. Every later step reads that one
    copy, and the sidecar's sha256 is the one the source took of it while copying, or admission's
    where the file is still as admission hashed it (``Read``): a local file is hashed once."""
    job = run.job
    limits = render.Limits.for_job(cfg.limits, job)
    read = await run.record.read() if isinstance(job.origin, LocalFile) else None
    bounded = dataclasses.replace(job, max_bytes=limits.max_bytes)
    fetched = await source.fetch(bounded, spool_dir, read)
    path = fetched.path
    digest = fetched.sha256
    if not digest:
        digest = await asyncio.to_thread(sha256_file, path)
    run.read = digest  # an error sidecar names the bytes read, whatever fails next
    with naming(path, job.origin):
        info = await asyncio.to_thread(render.probe, path, limits)
        spec = render.render_spec(cfg.render, engine.geometry)
        if info.kind == "pdf":  # raises for a page too large at any usable resolution
            render.plan_pdf(info, spec, job_id=job_id(job), uri=job.origin.uri)
            # and for an image in it too large to decode, however small the file
            await asyncio.to_thread(render.check_images, path, info, spec)
    return Probed(path, fetched.changed, info, spec, digest, fetched.access, read)


def job_lang(cfg: Config, run: JobRun) -> str | None:
    """The Tesseract languages asked for the job (``ocrwatch ocr --lang``), else those of its inbox
    (``[[inbox]] lang``); None: the engine's own."""
    job = run.job
    if run.asked is not None and run.asked.lang is not None:
        return run.asked.lang
    return cfg.inbox_lang(job.origin.inbox) if isinstance(job.origin, LocalFile) else None


def job_formats(cfg: Config, source: Source | None, job: Job) -> tuple[Format, ...]:
    """The files written for the job: its bucket's or its inbox's ``formats``, else
    ``[output]``'s."""
    if isinstance(job.origin, S3Object) and isinstance(source, Bucketed):
        return source.cfg.formats or cfg.output.formats
    if isinstance(job.origin, LocalFile):
        return cfg.inbox_formats(job.origin.inbox)
    return cfg.output.formats


def provenance(
    cfg: Config, run: JobRun, engine: Engine, probed: Probed, prompted: bool
) -> assemble.Provenance:
    """What was read, what read it and how: the sidecar's ``source``, ``engine`` (the prompt only
    where the engine reads one, ``prompted``), ``render``."""
    job, spec = run.job, probed.spec
    described = _described(engine, job_lang(cfg, run))
    if prompted:
        described |= {"prompt": cfg.prompt_text(job.prompt)}
    return assemble.Provenance(
        source=assemble.source_section(job, probed.path, probed.sha256, probed.info.mime),
        engine=described,
        render={"dpi": spec.dpi, "max_side": spec.max_side, "max_pixels": spec.max_pixels},
    )


def assemble_document(
    job: Job,
    provenance: assemble.Provenance,
    pages: list[PageOutcome],
    started: float,
    stages: dict[str, float],
    made: outputs.Outputs = outputs.NONE,
) -> dict[str, Any]:
    """The JSON sidecar: the pages, where they came from, what read them and how long it took."""
    return assemble.document(
        provenance,
        pages,
        detected=job.detected_at,
        started=started,
        finished=time.time(),
        stages=stages,
        assets=made.assets,
        outputs=made.sections,
    )


@contextlib.contextmanager
def timed(stages: dict[str, float], stage: str) -> Iterator[None]:
    """Record the block's duration as ``stages[stage]`` when it succeeds."""
    started = time.monotonic()
    yield
    stages[stage] = time.monotonic() - started


@contextlib.contextmanager
def naming(spool: Path, origin: Origin) -> Iterator[None]:
    """An error about the job's private copy names the document the user knows, not the spool."""
    try:
        yield
    except OcrwatchError as exc:
        known = str(origin.path) if isinstance(origin, LocalFile) else origin.uri
        exc.message = exc.message.replace(str(spool), known)
        exc.args = (exc.message,)
        raise


def _described(engine: Engine, lang: str | None) -> dict[str, Any]:
    """What the sidecar records of the engine: one that states its languages states the page's."""
    described = engine.describe()
    return described | {"lang": lang} if lang is not None and "lang" in described else described
