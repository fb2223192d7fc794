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
from typing import Any, get_args

from ocrwatch.pages import pdfcontent
from ocrwatch.pages.imagepages import DpiFrom
from ocrwatch.pages.orientation import DecidedBy
from ocrwatch.recognize import pagetext
from ocrwatch.results.textlayer import TextLayer

SCHEMA_ID = "ocrwatch/1"
"""Always the JSON sidecar's first member: sinks tell their own files from a user's by it."""

DRAFT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]


def _object(
    description: str, properties: Schema, required: tuple[str, ...] = (), *, closed: bool = True
) -> Schema:
    """An object of these members, each described; ``closed``: no other member."""
    schema: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _box(description: str, item: str = "number") -> Schema:
    return {
        "type": "array",
        "items": {"type": item},
        "minItems": 4,
        "maxItems": 4,
        "description": description,
    }


def _text(description: str, kind: str | list[str] = "string") -> Schema:
    return {"type": kind, "description": description}


_ISO = "ISO 8601 in UTC with milliseconds (2026-01-31T09:15:02.123+00:00)"
_SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"type": ["integer", "null"], "minimum": 0}
_SECONDS = {"type": "number", "minimum": 0}

ERROR = _object(
    "An ocrwatch error, as the log, the ledger and the hooks give it too.",
    {
        "kind": {
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]*$",
            "description": "The failure's stable name (corrupt_pdf, output_conflict, "
            "page_failed, page_timeout, ...: ocrwatch.errors; docs/operations.md, "
            "Troubleshooting).",
        },
        "message": _text("What happened, naming the file or the setting."),
        "retryable": _text("True: a transient fault that ocrwatch tries again itself.", "boolean"),
        "hint": _text("What to do about it."),
    },
    ("kind", "message", "retryable", "hint"),
)

SOURCE = _object(
    "The document that was read, so that a later look can tell whether the source still matches.",
    {
        "uri": _text(
            "Where the source lay when it was read: file:// with the path's bytes "
            "percent-encoded, or s3://bucket/key."
        ),
        "name": _text("Its file name (an S3 key's last part)."),
        "bytes": {
            "type": "integer",
            "minimum": 0,
            "description": "Its size in bytes, of the copy that was read; in an error "
            "sidecar of a document never read: as it lies (a local file) or as its event "
            "said (S3), 0 if unknown.",
        },
        "sha256": {
            **_SHA256,
            "type": ["string", "null"],
            "description": "SHA-256 of those bytes, hex; null in an error sidecar of a "
            "document never read.",
        },
        "etag": _text("S3 only: the object's ETag.", ["string", "null"]),
        "version_id": _text("S3 only: the object's version.", ["string", "null"]),
        "mtime": _text(
            f"Local files only: its modification time when read, {_ISO}.", ["string", "null"]
        ),
        "mime": _text(
            "Its type by content (application/pdf, image/png, image/jpeg, image/tiff, "
            "image/webp); absent from an error sidecar."
        ),
    },
    ("uri", "name", "bytes", "sha256"),
)

_CONF = {"type": "number", "minimum": 0, "maximum": 100}
_WORD = _object(
    "One word as Tesseract read it.",
    {
        "text": _text("The word."),
        "bbox": _box("The word's box, page pixels.", "integer"),
        "conf": {**_CONF, "description": "Tesseract's confidence in the word, 0 to 100."},
    },
    ("text", "bbox", "conf"),
)

BLOCK = _object(
    "A piece of the page's text and where it lies. Tesseract gives one block a line (type line, "
    "with its words), DeepSeek-OCR one a grounding tag; an engine may add members of its own.",
    {
        "type": _text(
            "What the block is: line (Tesseract), or DeepSeek-OCR's label (text, title, "
            "table, image, ...; an image block is a figure)."
        ),
        "text": _text("The block's text (Markdown for DeepSeek-OCR)."),
        "bbox": {
            **_box(
                "Its box in page pixels (of several boxes: their union); null: the engine gave "
                "none."
            ),
            "type": ["array", "null"],
        },
        "boxes": {
            "type": "array",
            "items": _box("One box, page pixels."),
            "description": "DeepSeek-OCR: every box of a block that spans several.",
        },
        "name": _text(
            "An image block's figure name, page-N-figure-K (from 1): the Markdown's "
            'placeholder and, with images = "extract", its file.'
        ),
        "conf": {**_CONF, "description": "Tesseract: its words' mean confidence, 0 to 100."},
        "paragraph": {
            "type": "integer",
            "minimum": 1,
            "description": "Tesseract: the number of the line's paragraph on its page.",
        },
        "words": {
            "type": "array",
            "items": _WORD,
            "description": "Tesseract: the line's words (what a searchable PDF places).",
        },
    },
    ("type", "text"),
    closed=False,
)

TRY = _object(
    "One attempt at the page, a rung of the retry ladder: a page whose output loops or runs out of "
    "tokens is read again with changed sampling.",
    {
        "rung": {"type": "integer", "minimum": 0, "description": "The rung, from 0 (greedy)."},
        "request_id": _text("The engine request's id, as the log names it."),
        "sampling": _text(
            "The rung's sampling (ocrwatch.engines.sampling.Sampling: temperature, "
            "ngram_size, window_size, max_tokens, repetition_penalty, stop_pattern, "
            "stop_count); absent for an engine that samples nothing (Tesseract; older "
            "sidecars record the defaults it ignored).",
            "object",
        ),
        "outcome": _text(
            "ok; loop or length (the output was judged so and the next rung tried); "
            "or the kind of the error that ended the attempt."
        ),
        "seconds": {**_SECONDS, "description": "How long the attempt took, seconds."},
        "error": {**ERROR, "description": "The error that ended the attempt, if one did."},
        "prompt_tokens": {**_COUNT, "description": "Prompt tokens (vLLM); null for Tesseract."},
        "completion_tokens": {**_COUNT, "description": "Tokens made (vLLM); null for Tesseract."},
        "finish_reason": _text(
            "Why the engine stopped (stop, length, repetition); null where it said nothing.",
            ["string", "null"],
        ),
    },
    ("rung", "request_id", "outcome", "seconds"),
)

TEXT_CHECK = _object(
    "Why a PDF page's own text was taken or not (ocrwatch.recognize.pagetext).",
    {
        "reason": {
            "enum": list(pagetext.REASONS),
            "description": "good or asked (the layer was taken: auto found it good, layer "
            "takes any), script_not_installed (taken: its letters are of a script no "
            "installed Tesseract language reads; package names the one that would); "
            "else why the page was OCR'd: no_text (none drawn: a scan), "
            "little_text, unreadable_codes (a font without a Unicode map), unmapped_font "
            "(punctuation only), unknown_letters (letters no installed Tesseract language "
            "has), unknown_words (too few words its languages know), no_dictionary "
            "(Tesseract's language data or tools absent), content_too_large or "
            "forms_too_deep (its content not read within bounds), unreadable_pdf, "
            "extraction_failed, extraction_timeout, text_too_large (pdftotext: it "
            "failed, ran past the render timeout, or wrote more than 4 MiB).",
        },
        "known_words": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 1,
            "description": "Share of the layer's word letters in words the page's "
            "languages know; null where the word test was not made.",
        },
        "seconds": {**_SECONDS, "description": "The check's time: reading and judging the layer."},
        "package": {
            "type": "string",
            "description": "With script_not_installed: the package of the Tesseract language "
            "that reads the layer's script (tesseract-ocr-chi-sim).",
        },
    },
    ("reason", "known_words", "seconds"),
)

PAGE = _object(
    "One page, in order: what the engine read and how it went.",
    {
        "index": {
            "type": "integer",
            "minimum": 1,
            "description": "The page's number, from 1 (the Markdown's <!-- page N -->).",
        },
        "width": {
            "type": "integer",
            "minimum": 1,
            "description": "Pixels across the rendered page, the image the engine read.",
        },
        "height": {"type": "integer", "minimum": 1, "description": "Pixels down that page."},
        "dpi": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "description": "The rendered page's pixels an inch: the page is width / dpi by "
            "height / dpi inches (the searchable PDF's page). null only in sidecars of an "
            "ocrwatch before dpi_from, for an image that recorded no resolution.",
        },
        "dpi_from": {
            "enum": list(get_args(DpiFrom)),
            "description": "Where dpi came from: render (a PDF page rasterised at it: "
            "[render] dpi or the engine's, lowered to the caps), image (the image file's "
            "own), image_dpi ([render] image_dpi: the file records none) or assumed (it "
            "records none: its long side taken as an A4 page's, at least 96 dpi). An "
            "image's DPI is scaled with it when it is downscaled.",
        },
        "source_dpi": {
            "type": "array",
            "items": {"type": "number", "exclusiveMinimum": 0},
            "minItems": 2,
            "maxItems": 2,
            "description": "Only for an image file whose resolutions across and down differ "
            "(a fax's 204 x 98): those two, [across, down]. Its pixels were made square "
            "before the engine read it, the lower-resolution side scaled up to the higher, so "
            "dpi is the higher one (times any downscale) and width / dpi by height / dpi "
            "inches is still the page's true size. Absent where they are equal.",
        },
        "rotation": {
            "enum": [0, 90, 180, 270],
            "description": "Degrees clockwise the rendered page (as a viewer shows "
            "it) was turned to be read upright ([render] rotate_pages); width, height "
            "and the boxes are the turned page's. 0 also where detection did not run.",
        },
        "orientation": {
            "oneOf": [
                {"type": "null"},
                _object(
                    "What Tesseract's orientation detection (OSD) said of the page.",
                    {
                        "detected": {
                            "enum": [0, 90, 180, 270, None],
                            "description": "Degrees clockwise that OSD says make the page "
                            "upright; null: it found too few characters to say, failed, or was "
                            "not asked (text_lines).",
                        },
                        "confidence": {
                            "type": ["number", "null"],
                            "minimum": 0,
                            "description": "OSD's orientation confidence (its margin over the "
                            "next orientation; where its glance at the page's densest text "
                            "decided, the glance's, a smaller figure); null with detected.",
                        },
                        "decided_by": {
                            "enum": list(get_args(DecidedBy)),
                            "description": "text_lines: decided without OSD, the page's text "
                            "lines running across it as upright Latin lines do once turned "
                            "by rotation (detected and confidence null); "
                            "osd: its answer taken as it is (0, or confidence at "
                            "[render] rotate_pages_threshold or more); reading: the page "
                            "read unturned, as OSD says and the opposite way, turned only "
                            "where the best of them read twice as many confident characters "
                            "as unturned; low_confidence, too_little_text, failed: kept as it "
                            "is.",
                        },
                        "read": {
                            **_COUNT,
                            "description": "The most confident characters any way round read "
                            "(decided_by reading); null where the page was not read.",
                        },
                        "reads_poorly": {
                            "type": "boolean",
                            "description": "true: no way round read 10 confident characters "
                            "(the page may be kept turned, or hold a script the check cannot "
                            "read); a page_reads_poorly warning is logged too.",
                        },
                    },
                    ("detected", "confidence", "decided_by"),
                ),
            ],
            "description": "null where detection did not run ([render] rotate_pages = false).",
        },
        "deskew": {
            "type": ["number", "null"],
            "description": "Degrees clockwise the upright page was turned about its centre "
            "to level its lines ([render] deskew), 0 where they were level; null: deskew "
            "is off.",
        },
        "text_source": {
            "enum": ["layer", "ocr"],
            "description": "Where the text came from: the PDF page's own text layer "
            "([[inbox]] text = auto where it passed the check, or layer: no "
            "engine ran, the page was not rendered, and width, height and dpi are "
            "what it would have been rendered at), or the engine's reading of the "
            "rendered page.",
        },
        "text_check": {
            "oneOf": [{"type": "null"}, TEXT_CHECK],
            "description": "The check of the page's own text; null where none ran "
            "(text = ocr, an image).",
        },
        "status": {
            "enum": ["ok", "failed"],
            "description": "failed: every rung of the retry ladder failed.",
        },
        "attempts": {
            "type": "integer",
            "minimum": 1,
            "description": "How many rungs were tried (the entries of tries).",
        },
        "markdown": _text(
            "The page's Markdown as the .md sidecar has it, figure links included; "
            "empty for a failed page."
        ),
        "raw": _text(
            "The engine's exact output of the last attempt that gave one (DeepSeek-OCR's "
            "grounding tags included); null: none did.",
            ["string", "null"],
        ),
        "blocks": {
            "type": "array",
            "items": BLOCK,
            "description": "The page's text with boxes, in reading order; empty where the "
            "engine gives none.",
        },
        "tokens": _object(
            "Token counts of the attempt kept.",
            {
                "prompt": {**_COUNT, "description": "Prompt tokens (vLLM); null for Tesseract."},
                "completion": {**_COUNT, "description": "Tokens made (vLLM); null for Tesseract."},
            },
        ),
        "seconds": _object(
            "Where the page's time went, seconds.",
            {
                "render": {**_SECONDS, "description": "Rendering the page image."},
                "orient": {
                    **_SECONDS,
                    "description": "Orientation detection and deskew (0: neither asked for).",
                },
                "recognize": {**_SECONDS, "description": "Every attempt together."},
            },
        ),
        "finish_reason": _text(
            "The kept attempt's: stop, length, repetition; null where the engine said nothing.",
            ["string", "null"],
        ),
        "error": {
            "oneOf": [{"type": "null"}, ERROR],
            "description": "Why the page failed (page_failed); null when it did not.",
        },
        "tries": {"type": "array", "items": TRY, "description": "Every attempt, in order."},
    },
    ("index", "width", "height", "status", "attempts", "markdown", "blocks"),
)

_FILE = {  # a further output: its path relative to the JSON sidecar's folder (or key prefix)
    "path": _text("The file, relative to this JSON's folder (or key prefix)."),
    "bytes": {"type": "integer", "minimum": 0, "description": "Its size in bytes."},
    "sha256": {**_SHA256, "description": "SHA-256 of its bytes, hex."},
}
_SKIPPED = _object(
    "A PDF page left without a text layer: its own content could not be read within bounds.",
    {
        "page": {"type": "integer", "minimum": 1, "description": "The page's number, from 1."},
        "reason": {
            "enum": [pdfcontent.CONTENT_TOO_LARGE, pdfcontent.FORMS_TOO_DEEP],
            "description": "Which bound: its content decoded, or its forms' depth.",
        },
        "message": _text("What was found."),
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
        _object(
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
        _object(
            "None: the source could not be read again; the rest of the document stands.",
            {"error": ERROR},
            ("error",),
        ),
    ],
}
ALTO = _object(
    '[output] formats "alto": NAME.alto.xml, the text and its boxes as ALTO 4.4, written beside '
    "the sidecars.",
    _FILE,
    ("path", "bytes", "sha256"),
)
HOCR = _object(
    '[output] formats "hocr": NAME.hocr, the text and its boxes as hOCR 1.2, written beside the '
    "sidecars.",
    _FILE,
    ("path", "bytes", "sha256"),
)
FIGURE = _object(
    'A figure cut out of its page as PNG ([output] images = "extract").',
    {
        "page": {"type": "integer", "minimum": 1, "description": "Its page's number, from 1."},
        "name": _text("page-N-figure-K: its image block's name."),
        "bbox": _box("Where it was cut from, page pixels (clipped to the page).", "integer"),
        **_FILE,
    },
    ("page", "name", "bbox", "path", "bytes", "sha256"),
)
OCRWATCH = _object(
    "What wrote the sidecar.",
    {"version": _text("ocrwatch's version."), "host": _text("The host name it ran on.")},
    ("version", "host"),
)
ENGINE = _object(
    "The engine that read it, with its settings (what it describes of itself; members beyond "
    "these are the engine's own).",
    {
        "name": _text("tesseract, vllm, or a plugin's name."),
        "version": _text("Tesseract's version."),
        "model": _text("vLLM: the model (a Hugging Face id or a folder)."),
        "lang": _text(
            "Tesseract's languages for this document (its inbox's lang, else "
            "[engine.tesseract] lang), as deu+eng."
        ),
        "prompt": _text(
            "The prompt it was read with (its inbox's or bucket's); absent for an engine that "
            "takes none (Tesseract; older sidecars record the one it ignored)."
        ),
    },
    ("name",),
    closed=False,
)
RENDER = _object(
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
TIMING = _object(
    "When it happened and how long each step took.",
    {
        "detected": _text(f"When the source was noticed, {_ISO}."),
        "started": _text(f"When this attempt began, {_ISO}."),
        "finished": _text(f"When the JSON was made, {_ISO}."),
        "stages": {
            "type": "object",
            "additionalProperties": _SECONDS,
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
    **_object(
        "What ocrwatch read from one document, beside it (or under [output] dir) after its "
        "Markdown, NAME.md, as the last file: a JSON sidecar means every output is complete.",
        {
            "schema": _SCHEMA_MEMBER,
            "status": {
                "enum": ["ok", "partial"],
                "description": "ok: every page read; partial: a page failed (its status).",
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
            "reused_from": _text(
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
    **_object(
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
            "time": _text(f"When it failed, {_ISO}."),
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
