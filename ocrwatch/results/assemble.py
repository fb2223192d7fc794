"""Join a document's pages into the two sidecars: Markdown for people, JSON (``ocrwatch/1``) for
programs."""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrwatch import __version__, plaintext
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.recognize import figures

# ocrwatch.results.schema's schemas (docs/schema/), re-exported here where their users import them
from ocrwatch.results.schema import ERROR_SCHEMA as ERROR_SCHEMA
from ocrwatch.results.schema import JSON_SCHEMA as JSON_SCHEMA
from ocrwatch.results.schema import SCHEMA_ID
from ocrwatch.sources.base import Job, LocalFile, S3Object

PAGE_MARK = "<!-- page "
"""Opens every page of the Markdown sidecar, so the file always begins with it: sinks tell their own
by it."""


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Provenance:
    """What the sidecar says about the source, the engine and the rendering."""

    source: dict[str, Any]
    engine: dict[str, Any]
    render: dict[str, Any]


def source_section(
    job: Job, path: Path | None, digest: str | None, mime: str | None
) -> dict[str, Any]:
    """The sidecar's ``source``: what was read, so a later look can tell whether the source still
    matches.

    ``path`` is the fetched file when there is one (a failure may come before the fetch); its size
    is what was processed. Without it, a local file's size is read where it lies, and an S3 object's
    size is the event's.
    """
    origin = job.origin
    section: dict[str, Any] = {"uri": origin.uri, "name": origin.name, "bytes": 0, "sha256": digest}
    if isinstance(origin, S3Object):
        section |= {"bytes": origin.size or 0, "etag": origin.etag, "version_id": origin.version_id}
    if path is not None:
        try:
            stat = path.stat()
            section["bytes"] = stat.st_size
            if isinstance(origin, LocalFile):
                section["mtime"] = iso(stat.st_mtime)
        except OSError:
            pass
    elif isinstance(origin, LocalFile):
        with contextlib.suppress(OSError):
            section["bytes"] = origin.path.lstat().st_size
    if mime:
        section["mime"] = mime
    return section


def page_markdown(outcome: PageOutcome, assets: str | None = None) -> str:
    """The page's Markdown; with ``assets`` (the figures' folder), its extracted figures linked to
    their files. An engine's plain text is made Markdown here, so the rendering reads as the text
    does."""
    recognition = outcome.result.recognition
    text = recognition.markdown.strip() if recognition is not None else ""
    if recognition is not None and recognition.plain is not None:
        text = plaintext.markdown(text, recognition.plain)
    return figures.link(text, outcome.figures, assets) if assets is not None else text


def markdown(pages: Sequence[PageOutcome], assets: str | None = None) -> str:
    parts = []
    for outcome in pages:
        body = (
            page_markdown(outcome, assets)
            if outcome.result.status == "ok"
            else "<!-- page failed -->"
        )
        parts.append(f"{PAGE_MARK}{outcome.index + 1} -->\n\n{body}\n")
    return "\n".join(parts)


def _page(outcome: PageOutcome, assets: str | None) -> dict[str, Any]:
    result = outcome.result
    recognition = result.recognition
    return {
        "index": outcome.index + 1,
        "width": outcome.width,
        "height": outcome.height,
        "dpi": outcome.dpi,
        "dpi_from": outcome.dpi_from,
        **({"source_dpi": list(outcome.source_dpi)} if outcome.source_dpi else {}),
        "rotation": outcome.orientation.rotation,
        "orientation": _orientation(outcome),
        "deskew": outcome.orientation.deskew,
        "text_source": outcome.text_source,
        "text_check": outcome.text_check,
        "status": result.status,
        "attempts": max(len(result.attempts), 1),
        "markdown": page_markdown(outcome, assets),
        "raw": recognition.raw if recognition is not None else None,
        "blocks": recognition.blocks if recognition is not None else [],
        "tokens": {
            "prompt": recognition.prompt_tokens if recognition is not None else None,
            "completion": recognition.completion_tokens if recognition is not None else None,
        },
        "seconds": {
            "render": round(outcome.render_seconds, 4),
            "orient": round(outcome.orientation.seconds, 4),
            "recognize": round(sum(a.get("seconds", 0.0) for a in result.attempts), 4),
        },
        "finish_reason": recognition.finish_reason if recognition is not None else None,
        "error": result.error,
        "tries": result.attempts,
    }


def _orientation(outcome: PageOutcome) -> dict[str, Any] | None:
    """What orientation detection said of the page; None where it did not run (``rotate_pages``
    off)."""
    turned = outcome.orientation
    if turned.decided_by is None:
        return None
    confidence = round(turned.confidence, 2) if turned.confidence is not None else None
    found = {"detected": turned.detected, "confidence": confidence, "decided_by": turned.decided_by}
    return {**found, "read": turned.read, "reads_poorly": turned.reads_poorly}


def document(
    provenance: Provenance,
    pages: Sequence[PageOutcome],
    *,
    detected: float,
    started: float,
    finished: float,
    stages: dict[str, float],
    assets: str | None = None,
    outputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON sidecar; ``assets``: the folder the figures were written to, ``outputs``: the
    members that describe further outputs (``searchable_pdf``, ``figures``)."""
    status = "ok" if all(p.result.status == "ok" for p in pages) else "partial"
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "source": provenance.source,
        "engine": provenance.engine,
        "render": provenance.render,
        **(
            outputs or {}
        ),  # before the pages: a sink finds ``searchable_pdf`` in the JSON's first bytes
        "pages": [_page(p, assets) for p in pages],
        "timing": {
            "detected": iso(detected),
            "started": iso(started),
            "finished": iso(finished),
            "stages": {name: round(value, 4) for name, value in stages.items()},
        },
        "ocrwatch": {"version": __version__, "host": socket.gethostname()},
    }


def error_document(
    source: dict[str, Any], error: dict[str, Any], attempts: int, when: float
) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "status": "failed",
        "source": source,
        "error": error,
        "attempts": attempts,
        "time": iso(when),
        "ocrwatch": {"version": __version__, "host": socket.gethostname()},
    }
