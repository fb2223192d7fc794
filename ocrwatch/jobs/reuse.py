"""Duplicates: a document whose very bytes its source already did takes that result instead of a
second OCR.

The same file dropped twice (``invoice.tif``, ``invoice.1.tif``) costs the engine nothing the second
time: the ledger finds the earlier job of the same source with the same content (its sha256, or an
S3 object's ETag and size), the sink reads that job's sidecars back where they are ocrwatch's own
and unchanged, and the copy's sidecars are those, with ``source`` describing the copy and
``reused_from`` naming the earlier file. The earlier JSON must record the same sha256 as the bytes
just read, its status be ``ok``, and neither it nor this configuration involve outputs beyond the
two sidecars (a searchable PDF, ALTO, hOCR, figures): those are made, not copied. Locally, only a
result written for the same user's file is reused, so a drop never tells one user what another
has.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import structlog

from ocrwatch.config import SIDECARS, OutputConfig
from ocrwatch.jobs.admission import Offload
from ocrwatch.results.assemble import Provenance, iso
from ocrwatch.sinks.base import Recalled, Sink
from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.store.asyncledger import AsyncLedger

log = structlog.get_logger()

FURTHER = ("searchable_pdf", "alto", "hocr", "figures", "assets")
"""JSON members that describe outputs beyond the two sidecars: a result that has them is not
copied."""


@dataclass(frozen=True)
class Reused:
    """The copy's sidecars: the earlier Markdown as it was written, and its JSON made the copy's."""

    markdown: str
    document: dict[str, Any]
    earlier: Job


class Reuse:
    """Finds and adapts the earlier result of a job's bytes. Blocking calls run in threads
    (``offload`` for the sinks', ``AsyncLedger`` for the ledger's)."""

    def __init__(
        self,
        ledger: AsyncLedger | None,
        sinks: dict[str, Sink],
        output: OutputConfig,
        offload: Offload,
    ) -> None:
        self.ledger = ledger
        self.sinks = sinks
        self.makes_more = output.searchable_pdf or output.images == "extract"
        self._offload = offload

    async def find(
        self,
        job: Job,
        sha256: str,
        provenance: Provenance,
        owner: int | None,
        formats: Collection[str] = SIDECARS,
    ) -> Reused | None:
        """The earlier result this job may take (``provenance``: what its own sidecar would say of
        its source, engine and rendering; ``owner``: its local file's user; ``formats``: the files
        it is to get), or None: it is then read as any other."""
        more = self.makes_more or not set(formats) <= set(SIDECARS)
        if job.duplicates != "reuse" or self.ledger is None or more:
            return None
        sink = self.sinks.get(job.source)
        if sink is None:
            return None
        for earlier in await self.ledger.twins(job, sha256):
            if not _same_place(earlier, job):
                continue
            recalled: Recalled | None = await self._offload(job, sink.recall, earlier, owner)
            if recalled is not None and _reusable(recalled.document, sha256, provenance):
                return _adapted(recalled, earlier, job, provenance.source, job.detected_at)
        return None


def _same_place(earlier: Job, job: Job) -> bool:
    """Locally, the same inbox: its settings (``lang``, ``text``, ``prompt``) made the earlier
    result."""
    if isinstance(job.origin, LocalFile):
        return isinstance(earlier.origin, LocalFile) and earlier.origin.inbox == job.origin.inbox
    return True


def _adapted(
    recalled: Recalled, earlier: Job, job: Job, source: dict[str, Any], detected: float
) -> Reused:
    """The earlier sidecars made the copy's: its ``source``, the earlier file named, its own
    timing."""
    now = time.time()
    document = {
        **recalled.document,
        "source": source,
        "reused_from": earlier.origin.uri,
        "timing": {
            "detected": iso(detected),
            "started": iso(now),
            "finished": iso(now),
            "stages": {},
        },
    }
    log.info("job_reused", uri=job.origin.uri, reused_from=earlier.origin.uri)
    return Reused(recalled.markdown.decode("utf-8", "replace"), document, earlier)


def _reusable(document: dict[str, Any], sha256: str, provenance: Provenance) -> bool:
    """An ``ok`` result of these very bytes with nothing beyond its two sidecars, read by the
    engine, languages, prompt and rendering this job would get."""
    source = document.get("source")
    recorded = source.get("sha256") if isinstance(source, dict) else None
    return (
        document.get("status") == "ok"
        and recorded == sha256
        and document.get("engine") == _as_json(provenance.engine)
        and document.get("render") == _as_json(provenance.render)
        and not any(member in document for member in FURTHER)
    )


def _as_json(section: dict[str, Any]) -> Any:
    """``section`` as a JSON sidecar reads back (tuples as lists), to compare with one that was."""
    return json.loads(json.dumps(section))
