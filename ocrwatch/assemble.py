"""Join a document's pages into the two sidecars: Markdown for people, JSON (``ocrwatch/1``) for programs."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrwatch import __version__, figures
from ocrwatch.scheduler import PageOutcome
from ocrwatch.sources.base import Job, LocalFile, S3Object

SCHEMA_ID = "ocrwatch/1"
"""Always the JSON sidecar's first member: sinks tell their own files from a user's by it."""
PAGE_MARK = "<!-- page "
"""Opens every page of the Markdown sidecar, so the file always begins with it: sinks tell their own by it."""

_BLOCK = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {
        "type": {"type": "string"},
        "text": {"type": "string"},
        "bbox": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
    },
}
_PAGE = {
    "type": "object",
    "required": ["index", "width", "height", "status", "attempts", "markdown", "blocks"],
    "properties": {
        "index": {"type": "integer", "minimum": 1},
        "width": {"type": "integer", "minimum": 1},
        "height": {"type": "integer", "minimum": 1},
        "dpi": {"type": ["number", "null"]},
        "status": {"enum": ["ok", "failed"]},
        "attempts": {"type": "integer", "minimum": 1},
        "markdown": {"type": "string"},
        "raw": {"type": ["string", "null"]},
        "blocks": {"type": "array", "items": _BLOCK},
        "tokens": {
            "type": "object",
            "properties": {"prompt": {"type": ["integer", "null"]}, "completion": {"type": ["integer", "null"]}},
        },
        "seconds": {"type": "object"},
        "finish_reason": {"type": ["string", "null"]},
        "error": {"type": ["object", "null"]},
        "tries": {"type": "array"},
    },
}
_FILE = {  # a further output: its path relative to the JSON sidecar's folder (or key prefix)
    "path": {"type": "string"},
    "bytes": {"type": "integer", "minimum": 0},
    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
}
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ocrwatch sidecar",
    "type": "object",
    "required": ["schema", "status", "source", "engine", "render", "pages", "timing", "ocrwatch"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "status": {"enum": ["ok", "partial"]},
        "source": {
            "type": "object",
            "required": ["uri", "name", "bytes", "sha256"],
            "properties": {
                "uri": {"type": "string"},
                "name": {"type": "string"},
                "bytes": {"type": "integer", "minimum": 0},
                "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
                "etag": {"type": ["string", "null"]},
                "version_id": {"type": ["string", "null"]},
                "mtime": {"type": ["string", "null"]},
                "mime": {"type": "string"},
            },
        },
        "engine": {"type": "object", "required": ["name"]},
        "render": {"type": "object", "required": ["dpi"]},
        "pages": {"type": "array", "minItems": 1, "items": _PAGE},
        "timing": {"type": "object", "required": ["detected", "started", "finished", "stages"]},
        "ocrwatch": {"type": "object", "required": ["version", "host"]},
        "searchable_pdf": {
            "oneOf": [
                {
                    "type": "object", "required": ["path", "bytes", "sha256"],
                    "properties": {**_FILE, "text_layer": {"type": "array", "items": {"enum": ["own", "ocr", "none"]}}},
                },  # fmt: skip
                {"type": "object", "required": ["error"], "properties": {"error": {"type": "object"}}},
            ]
        },
        "figures": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["page", "name", "bbox", "path", "bytes", "sha256"],
                "properties": {
                    "page": {"type": "integer", "minimum": 1},
                    "name": {"type": "string"},
                    "bbox": {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4},
                    **_FILE,
                },
            },
        },
    },
}
ERROR_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "status", "source", "error", "attempts", "time"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "status": {"const": "failed"},
        "error": {"type": "object", "required": ["kind", "message", "retryable", "hint"]},
        "attempts": {"type": "integer", "minimum": 0},
    },
}


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


def source_section(job: Job, path: Path | None, digest: str | None, mime: str | None) -> dict[str, Any]:
    """The sidecar's ``source``: what was read, so a later look can tell whether the source still matches.

    ``path`` is the fetched file when there is one (a failure may come before the fetch); its size is what was
    processed. Without it, a local file's size is read where it lies, and an S3 object's size is the event's.
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
        try:
            section["bytes"] = origin.path.lstat().st_size
        except OSError:
            pass
    if mime:
        section["mime"] = mime
    return section


def page_markdown(outcome: PageOutcome, assets: str | None = None) -> str:
    """The page's Markdown; with ``assets`` (the figures' folder), its extracted figures linked to their files."""
    recognition = outcome.result.recognition
    text = recognition.markdown.strip() if recognition is not None else ""
    return figures.link(text, outcome.figures, assets) if assets is not None else text


def markdown(pages: Sequence[PageOutcome], assets: str | None = None) -> str:
    parts = []
    for outcome in pages:
        body = page_markdown(outcome, assets) if outcome.result.status == "ok" else "<!-- page failed -->"
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
            "recognize": round(sum(a.get("seconds", 0.0) for a in result.attempts), 4),
        },
        "finish_reason": recognition.finish_reason if recognition is not None else None,
        "error": result.error,
        "tries": result.attempts,
    }


def document(
    provenance: Provenance, pages: Sequence[PageOutcome], *, detected: float, started: float, finished: float,
    stages: dict[str, float], assets: str | None = None, outputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON sidecar; ``assets``: the folder the figures were written to, ``outputs``: the members that
    describe further outputs (``searchable_pdf``, ``figures``)."""
    status = "ok" if all(p.result.status == "ok" for p in pages) else "partial"
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "source": provenance.source,
        "engine": provenance.engine,
        "render": provenance.render,
        **(outputs or {}),  # before the pages: a sink finds ``searchable_pdf`` in the JSON's first bytes
        "pages": [_page(p, assets) for p in pages],
        "timing": {
            "detected": iso(detected),
            "started": iso(started),
            "finished": iso(finished),
            "stages": {name: round(value, 4) for name, value in stages.items()},
        },
        "ocrwatch": {"version": __version__, "host": socket.gethostname()},
    }


def error_document(source: dict[str, Any], error: dict[str, Any], attempts: int, when: float) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "status": "failed",
        "source": source,
        "error": error,
        "attempts": attempts,
        "time": iso(when),
        "ocrwatch": {"version": __version__, "host": socket.gethostname()},
    }
