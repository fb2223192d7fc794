"""The sidecars' JSON Schemas: NAME.json's (``JSON_SCHEMA``), NAME.error.json's (``ERROR_SCHEMA``).

One source: the files under ``docs/schema/`` are these dictionaries as ``published()`` writes them
(``docs/schema/generate.py`` writes them again, and a test checks that they match), and the test
suite validates every sidecar it reads against those files. Every member ocrwatch writes is
described here, with its unit, and the objects ocrwatch fills itself allow no other member, so a new
field cannot reach a sidecar without its description. What an engine says of itself (``engine``)
and of a block beyond its type, text and boxes stays open: a plugin engine may add its own.

Coordinates: a box is ``[left, top, right, bottom]`` in pixels of the rendered page as the engine
read it, turned upright (``pages[].width`` x ``pages[].height``, after ``pages[].rotation`` and
``pages[].deskew``), its origin at the top-left corner; at ``pages[].dpi`` pixels an inch the page
is ``width / dpi`` inches wide.
"""

from __future__ import annotations

import json
from typing import get_args

from ocrwatch.pages import pdfcontent
from ocrwatch.results.pageschema import (
    ERROR,
    ISO_TIME,
    PAGE,
    SECONDS,
    SHA256,
    Schema,
    box_of,
    object_of,
    text_of,
)
from ocrwatch.results.textlayer import TextLayer

SCHEMA_ID = "ocrwatch/1"
"""Always the JSON sidecar's first member: sinks tell their own files from a user's by it."""

DRAFT = "https://json-schema.org/draft/2020-12/schema"

SOURCE = object_of(
    "The document that was read, so that a later look can tell whether the source still matches.",
    {
        "uri": text_of(
            "Where the source lay when it was read: file:// with the path's bytes "
            "percent-encoded, or s3://bucket/key."
        ),
        "name": text_of("Its file name (an S3 key's last part)."),
        "bytes": {
            "type": "integer",
            "minimum": 0,
            "description": "Its size in bytes, of the copy that was read; in an error "
            "sidecar of a document never read: as it lies (a local file) or as its event "
            "said (S3), 0 if unknown.",
        },
        "sha256": {
            **SHA256,
            "type": ["string", "null"],
            "description": "SHA-256 of those bytes, hex; null in an error sidecar of a "
            "document never read.",
        },
        "etag": text_of("S3 only: the object's ETag.", ["string", "null"]),
        "version_id": text_of("S3 only: the object's version.", ["string", "null"]),
        "mtime": text_of(
            f"Local files only: its modification time when read, {ISO_TIME}.", ["string", "null"]
        ),
        "mime": text_of(
            "Its type by content (application/pdf, image/png, image/jpeg, image/tiff, "
            "image/webp); absent from an error sidecar."
        ),
    },
    ("uri", "name", "bytes", "sha256"),
)

_FILE = {  # a further output: its path relative to the JSON sidecar's folder (or key prefix)
    "path": text_of("The file, relative to this JSON's folder (or key prefix)."),
    "bytes": {"type": "integer", "minimum": 0, "description": "Its size in bytes."},
    "sha256": {**SHA256, "description": "SHA-256 of its bytes, hex."},
}
_SKIPPED = object_of(
    "A PDF page left without a text layer: its own content could not be read within bounds.",
    {
        "page": {"type": "integer", "minimum": 1, "description": "The page's number, from 1."},
        "reason": {
            "enum": [pdfcontent.CONTENT_TOO_LARGE, pdfcontent.FORMS_TOO_DEEP],
            "description": "Which bound: its content decoded, or its forms' depth.",
        },
        "message": text_of("What was found."),
    },
    ("page", "reason", "message"),
)
_LAYERS = {
    "type": "array",
    "items": {"enum": list(get_args(TextLayer))},
    "description": "Each page's text: own (a PDF page's own, left as it is), ocr (the "
    "engine's, added) or none (a failed page, or one skipped).",
}
SEARCHABLE_PDF = {
    "description": "[output] searchable_pdf: the PDF with an invisible text layer, or why none.",
    "oneOf": [
        object_of(
            "The searchable PDF, written beside the sidecars.",
            {
                **_FILE,
                "text_layer": _LAYERS,
                "text_layer_skipped": {
                    "type": "array",
                    "items": _SKIPPED,
                    "description": "The pages left without a layer, and why.",
                },
            },
            ("path", "bytes", "sha256", "text_layer"),
        ),
        object_of(
            "None: the source could not be read again; the rest of the document stands.",
            {"error": ERROR},
            ("error",),
        ),
    ],
}
ALTO = object_of(
    '[output] formats "alto": NAME.alto.xml, the text and its boxes as ALTO 4.4, written beside '
    "the sidecars.",
    _FILE,
    ("path", "bytes", "sha256"),
)
HOCR = object_of(
    '[output] formats "hocr": NAME.hocr, the text and its boxes as hOCR 1.2, written beside the '
    "sidecars.",
    _FILE,
    ("path", "bytes", "sha256"),
)
FIGURE = object_of(
    'A figure cut out of its page as PNG ([output] images = "extract").',
    {
        "page": {"type": "integer", "minimum": 1, "description": "Its page's number, from 1."},
        "name": text_of("page-N-figure-K: its image block's name."),
        "bbox": box_of("Where it was cut from, page pixels (clipped to the page).", "integer"),
        **_FILE,
    },
    ("page", "name", "bbox", "path", "bytes", "sha256"),
)
OCRWATCH = object_of(
    "What wrote the sidecar.",
    {"version": text_of("ocrwatch's version."), "host": text_of("The host name it ran on.")},
    ("version", "host"),
)
ENGINE = object_of(
    "The engine that read it, with its settings (what it describes of itself; members beyond "
    "these are the engine's own).",
    {
        "name": text_of("tesseract, vllm, or a plugin's name."),
        "version": text_of("Tesseract's version."),
        "model": text_of("vLLM: the model (a Hugging Face id or a folder)."),
        "lang": text_of(
            "Tesseract's languages for this document (its inbox's lang, else "
            "[engine.tesseract] lang), as deu+eng."
        ),
        "prompt": text_of(
            "The prompt it was read with (its inbox's or bucket's); absent for an engine that "
            "takes none (Tesseract; older sidecars record the one it ignored)."
        ),
    },
    ("name",),
    closed=False,
)
RENDER = object_of(
    "How pages were rendered.",
    {
        "dpi": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "The DPI PDF pages are rendered at before the caps lower it "
            "([render] dpi, else the engine's); each page's own is pages[].dpi.",
        },
        "max_side": {
            "type": "integer",
            "minimum": 1,
            "description": "A page's longest side at most, pixels.",
        },
        "max_pixels": {"type": "integer", "minimum": 1, "description": "A page's pixels at most."},
    },
    ("dpi",),
)
TIMING = object_of(
    "When it happened and how long each step took.",
    {
        "detected": text_of(f"When the source was noticed, {ISO_TIME}."),
        "started": text_of(f"When this attempt began, {ISO_TIME}."),
        "finished": text_of(f"When the JSON was made, {ISO_TIME}."),
        "stages": {
            "type": "object",
            "additionalProperties": SECONDS,
            "description": "Seconds per stage of this attempt: waiting (noticed to "
            "started), fetch_probe, pages (rendering and reading every page), "
            "searchable_pdf (when one is made), layouts (the ALTO and hOCR files, when made).",
        },
    },
    ("detected", "started", "finished", "stages"),
)
_SCHEMA_MEMBER = {"const": SCHEMA_ID, "description": "This format and version; the first member."}

JSON_SCHEMA: Schema = {
    "$schema": DRAFT,
    "title": "ocrwatch sidecar (NAME.json)",
    **object_of(
        "What ocrwatch read from one document, beside it (or under [output] dir) after its "
        "Markdown, NAME.md, as the last file: a JSON sidecar means every output is complete.",
        {
            "schema": _SCHEMA_MEMBER,
            "status": {
                "enum": ["ok", "partial"],
                "description": "ok: every page read; partial: a page failed (its status), or "
                "was read in languages of another script (its script_not_installed).",
            },
            "source": SOURCE,
            "engine": ENGINE,
            "render": RENDER,
            "searchable_pdf": SEARCHABLE_PDF,
            "alto": ALTO,
            "hocr": HOCR,
            "figures": {
                "type": "array",
                "items": FIGURE,
                "description": '[output] images = "extract": every figure, in order.',
            },
            "pages": {
                "type": "array",
                "minItems": 1,
                "items": PAGE,
                "description": "Every page, in order.",
            },
            "reused_from": text_of(
                "The URI of the earlier file with these very bytes whose result this is "
                '([[inbox]] duplicates = "reuse"): its pages were not read again.'
            ),
            "timing": TIMING,
            "ocrwatch": OCRWATCH,
        },
        ("schema", "status", "source", "engine", "render", "pages", "timing", "ocrwatch"),
    ),
}

ERROR_SCHEMA: Schema = {
    "$schema": DRAFT,
    "title": "ocrwatch error sidecar (NAME.error.json)",
    **object_of(
        "Why a document failed for good, beside it (or under [output] dir) in place of NAME.md and "
        "NAME.json (an earlier version's are removed once it is written); removed when a later "
        "version succeeds.",
        {
            "schema": _SCHEMA_MEMBER,
            "status": {"const": "failed", "description": "Always failed."},
            "source": SOURCE,
            "error": ERROR,
            "attempts": {
                "type": "integer",
                "minimum": 0,
                "description": "How many times the document was tried ([retry] attempts "
                "bounds them; a fault of the document itself fails it at the first).",
            },
            "time": text_of(f"When it failed, {ISO_TIME}."),
            "ocrwatch": OCRWATCH,
        },
        ("schema", "status", "source", "error", "attempts", "time"),
    ),
}

FILES = {"sidecar.schema.json": JSON_SCHEMA, "error.schema.json": ERROR_SCHEMA}
"""The published files, by name, under ``docs/schema/``."""


def published() -> dict[str, str]:
    """Each file's text as published: indented JSON, a final newline, members in written order."""
    return {
        name: json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
        for name, schema in FILES.items()
    }
