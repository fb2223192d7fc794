"""What ``ocrwatch status`` shows, shaped from the ledger (no daemon) or from a running pipeline.

Imports nothing of the pipeline at run time, so ``ocrwatch status`` never loads it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ocrwatch.config import Config
from ocrwatch.control.protocol import REQUEST_PREFIX
from ocrwatch.sources.base import Job, S3Object

if TYPE_CHECKING:
    from ocrwatch.jobs.pipeline import Progress
    from ocrwatch.store.ledger import Ledger


def place(job: Job) -> str:
    """Where a job waits, as ``ocrwatch status`` groups the queue: its inbox, its bucket, or
    ``ocrwatch ocr``."""
    origin = job.origin
    if isinstance(origin, S3Object):
        return f"s3://{origin.bucket}"
    if job.source.startswith(REQUEST_PREFIX):
        return "ocrwatch ocr"
    return str(origin.inbox)


def ledger_status(ledger: Ledger) -> dict[str, Any]:
    """What ``ocrwatch status`` shows with no daemon running (blocking): the ledger's summary, and
    its unfinished jobs by inbox, all waiting for the next start."""
    queue: Counter[str] = Counter(place(row.job) for row in ledger.unfinished())
    return ledger.summary() | {
        "daemon": None,
        "documents": [],
        "queue": {where: {"running": 0, "waiting": n} for where, n in queue.items()},
    }


def pipeline_status(progress: list[Progress]) -> dict[str, Any]:
    """The running documents with their pages, and the queue by inbox, as a running daemon holds
    them."""
    queue: dict[str, dict[str, int]] = {}
    for p in progress:
        counts = queue.setdefault(place(p.job), {"running": 0, "waiting": 0})
        counts["running" if p.running else "waiting"] += 1
    documents = [
        {
            "uri": p.job.origin.uri,
            "pages_done": p.pages_done,
            "pages_total": p.pages_total,
            "eta_seconds": None if p.eta_seconds is None else round(p.eta_seconds, 1),
        }
        for p in sorted(progress, key=lambda p: p.job.detected_at)
        if p.running
    ]
    return {"documents": documents, "queue": queue}


def listeners(cfg: Config) -> dict[str, str]:
    """The TCP addresses a daemon of ``cfg`` listens on, by the key that sets each: ``check`` binds
    them, and a running daemon names them in its status, so ``check`` tells its ports from a
    stranger's."""
    found = {"[metrics] listen": cfg.metrics.listen} if cfg.metrics.enabled else {}
    for index, s3 in enumerate(cfg.s3):
        if s3.transport == "webhook":
            found[f"s3[{index}].listen"] = s3.listen
    return found
