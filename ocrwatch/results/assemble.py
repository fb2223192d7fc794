"""Join a document's pages into the two sidecars: Markdown for people, JSON (``ocrwatch/1``) for
programs.

A page OCR'd in languages that do not read the script orientation detection found on it, and read
poorly in them (``unread_script``), says so in its JSON with the package that would read it, and
its document is ``partial``, with one warning: its text is likely gibberish, never a silent ``ok``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ocrwatch import __version__, plaintext
from ocrwatch.pages import osd
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.recognize import figures

# ocrwatch.results.schema's schemas (docs/schema/), re-exported here where their users import them
from ocrwatch.results.schema import ERROR_SCHEMA as ERROR_SCHEMA
from ocrwatch.results.schema import JSON_SCHEMA as JSON_SCHEMA
from ocrwatch.results.schema import SCHEMA_ID
from ocrwatch.sources.base import Job, LocalFile, S3Object

log = structlog.get_logger()

MIN_CONFIDENT = 0.5
"""Share of an OCR'd page's letters in words Tesseract read at ``osd.READ_CONFIDENCE`` or more
below which a page whose script its languages do not read is taken as unread. In the corpus, read
in eng: the Latin pages OSD misnames Cyrillic 0.64 and 0.70, the Arabic, Devanagari and Chinese
pages 0.04, 0.17 and 0.02 (digits left out: a Chinese table's read confidently)."""

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
        "lang": recognition.lang if recognition is not None else None,
        **({"script_not_installed": unread} if (unread := unread_script(outcome)) else {}),
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
    return {
        **found,
        "read": turned.read,
        "reads_poorly": turned.reads_poorly,
        "script": turned.script,
    }


def unread_script(outcome: PageOutcome) -> dict[str, str] | None:
    """The script, languages and package of a page OCR'd in languages that do not read the script
    OSD found on it, which read under ``MIN_CONFIDENT`` of its letters confidently; None for
    any other page (a layer taken, an engine that takes no language, no script found)."""
    recognition, script = outcome.result.recognition, outcome.orientation.script
    if recognition is None or recognition.lang is None or script is None:
        return None
    package = osd.package(script)
    if outcome.text_source != "ocr" or package is None or osd.reads(recognition.lang, script):
        return None
    words = [word for block in recognition.blocks for word in block.get("words", ())]
    letters = [(sum(c.isalpha() for c in word["text"]), word["conf"]) for word in words]
    sure = sum(count for count, conf in letters if conf >= osd.READ_CONFIDENCE)
    if sure >= MIN_CONFIDENT * sum(count for count, _ in letters) > 0:
        return None
    return {
        "script": script,
        "lang": recognition.lang,
        "package": package,
        "hint": f'install {package}; lang = "auto" then reads such pages in its language',
    }


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
    unread = {p.index + 1: found for p in pages if (found := unread_script(p))}
    if unread:
        packages = sorted({found["package"] for found in unread.values()})
        log.warning(
            "page_script_not_installed",
            pages=sorted(unread),
            packages=packages,
            hint=f'install {" ".join(packages)}; lang = "auto" then reads each page in its own',
        )
    ok = all(p.result.status == "ok" for p in pages) and not unread
    status = "ok" if ok else "partial"
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
