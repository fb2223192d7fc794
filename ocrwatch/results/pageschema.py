"""The JSON Schema of one page of a result sidecar (``pages[]``: its blocks, words, tries, text
check and orientation), and the small builders ``schema`` shares: a page is the largest part of the
document, and the part engines and the page pipeline change most often.

Coordinates are as ``schema`` states them: pixels of the rendered page turned upright.
"""

from __future__ import annotations

from typing import Any, get_args

from ocrwatch.pages.imagepages import DpiFrom
from ocrwatch.pages.orientation import DecidedBy
from ocrwatch.recognize import pagetext

Schema = dict[str, Any]


def object_of(
    description: str, properties: Schema, required: tuple[str, ...] = (), *, closed: bool = True
) -> Schema:
    """An object of these members, each described; ``closed``: no other member."""
    schema: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def box_of(description: str, item: str = "number") -> Schema:
    return {
        "type": "array",
        "items": {"type": item},
        "minItems": 4,
        "maxItems": 4,
        "description": description,
    }


def text_of(description: str, kind: str | list[str] = "string") -> Schema:
    return {"type": kind, "description": description}


ISO_TIME = "ISO 8601 in UTC with milliseconds (2026-01-31T09:15:02.123+00:00)"
SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
COUNT = {"type": ["integer", "null"], "minimum": 0}
SECONDS = {"type": "number", "minimum": 0}

ERROR = object_of(
    "An ocrwatch error, as the log, the ledger and the hooks give it too.",
    {
        "kind": {
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]*$",
            "description": "The failure's stable name (corrupt_pdf, output_conflict, "
            "page_failed, page_timeout, ...: ocrwatch.errors; docs/operations.md, "
            "Troubleshooting).",
        },
        "message": text_of("What happened, naming the file or the setting."),
        "retryable": text_of(
            "True: a transient fault that ocrwatch tries again itself.", "boolean"
        ),
        "hint": text_of("What to do about it."),
    },
    ("kind", "message", "retryable", "hint"),
)

_CONF = {"type": "number", "minimum": 0, "maximum": 100}
_WORD = object_of(
    "One word as Tesseract read it.",
    {
        "text": text_of("The word."),
        "bbox": box_of("The word's box, page pixels.", "integer"),
        "conf": {**_CONF, "description": "Tesseract's confidence in the word, 0 to 100."},
    },
    ("text", "bbox", "conf"),
)

BLOCK = object_of(
    "A piece of the page's text and where it lies. Tesseract gives one block a line (type line, "
    "with its words), DeepSeek-OCR one a grounding tag; an engine may add members of its own.",
    {
        "type": text_of(
            "What the block is: line (Tesseract), or DeepSeek-OCR's label (text, title, "
            "table, image, ...; an image block is a figure)."
        ),
        "text": text_of("The block's text (Markdown for DeepSeek-OCR)."),
        "bbox": {
            **box_of(
                "Its box in page pixels (of several boxes: their union); null: the engine gave "
                "none."
            ),
            "type": ["array", "null"],
        },
        "boxes": {
            "type": "array",
            "items": box_of("One box, page pixels."),
            "description": "DeepSeek-OCR: every box of a block that spans several.",
        },
        "name": text_of(
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

TRY = object_of(
    "One attempt at the page, a rung of the retry ladder: a page whose output loops or runs out of "
    "tokens is read again with changed sampling.",
    {
        "rung": {"type": "integer", "minimum": 0, "description": "The rung, from 0 (greedy)."},
        "request_id": text_of("The engine request's id, as the log names it."),
        "sampling": text_of(
            "The rung's sampling (ocrwatch.engines.sampling.Sampling: temperature, "
            "ngram_size, window_size, max_tokens, repetition_penalty, stop_pattern, "
            "stop_count); absent for an engine that samples nothing (Tesseract; older "
            "sidecars record the defaults it ignored).",
            "object",
        ),
        "outcome": text_of(
            "ok; loop or length (the output was judged so and the next rung tried); "
            "or the kind of the error that ended the attempt."
        ),
        "seconds": {**SECONDS, "description": "How long the attempt took, seconds."},
        "error": {**ERROR, "description": "The error that ended the attempt, if one did."},
        "prompt_tokens": {**COUNT, "description": "Prompt tokens (vLLM); null for Tesseract."},
        "completion_tokens": {**COUNT, "description": "Tokens made (vLLM); null for Tesseract."},
        "finish_reason": text_of(
            "Why the engine stopped (stop, length, repetition); null where it said nothing.",
            ["string", "null"],
        ),
    },
    ("rung", "request_id", "outcome", "seconds"),
)

TEXT_CHECK = object_of(
    "Why a PDF page's own text was taken or not (ocrwatch.recognize.pagetext).",
    {
        "reason": {
            "enum": list(pagetext.REASONS),
            "description": "good or asked (the layer was taken: auto found it good, layer "
            "takes any), script_not_installed (taken: its letters are of a script no "
            "installed Tesseract language reads; package names the one that would), "
            "script_not_in_lang (taken: one installed does, but the page's lang does not name "
            "it; package names it); "
            "else why the page was OCR'd: no_text (none drawn: a scan), "
            "little_text, unreadable_codes (a font without a Unicode map), unmapped_font "
            "(punctuation only), unknown_letters (letters the page's Tesseract languages do not "
            "have), unknown_words (too few words its languages know), no_dictionary "
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
        "seconds": {**SECONDS, "description": "The check's time: reading and judging the layer."},
        "package": {
            "type": "string",
            "description": "With script_not_installed or script_not_in_lang: the package of the "
            "Tesseract language that reads the layer's script (tesseract-ocr-chi-sim).",
        },
    },
    ("reason", "known_words", "seconds"),
)

PAGE = object_of(
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
                object_of(
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
                            **COUNT,
                            "description": "The most confident characters any way round read "
                            "(decided_by reading); null where the page was not read.",
                        },
                        "reads_poorly": {
                            "type": "boolean",
                            "description": "true: no way round read 10 confident characters "
                            "(the page may be kept turned, or hold a script the check cannot "
                            "read); a page_reads_poorly warning is logged too.",
                        },
                        "script": {
                            "type": ["string", "null"],
                            "description": "The script OSD found the page written in (Latin, "
                            "Cyrillic, Arabic, Han, ...; Latin where its text lines decided), by "
                            'which lang = "auto" picks the page\'s language; null: OSD did not '
                            "run or named none. OSD names Cyrillic for some Latin pages.",
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
        "lang": {
            "type": ["string", "null"],
            "description": "The Tesseract languages the page was read in (deu+eng; for "
            'lang = "auto" those of its script, eng where none is installed); null: taken from '
            "its text layer, or read by an engine that takes no language.",
        },
        "script_not_installed": object_of(
            "Only where the page was OCR'd in languages that do not read the script OSD found "
            "on it and read poorly in them (its text is likely gibberish): the document is "
            "partial and a page_script_not_installed warning is logged.",
            {
                "script": {"type": "string", "description": "OSD's script (Hebrew)."},
                "lang": {"type": "string", "description": "The languages it was read in."},
                "package": {
                    "type": "string",
                    "description": "The Debian package of the script's language "
                    "(tesseract-ocr-heb).",
                },
                "hint": {"type": "string", "description": "What to do about it."},
            },
            ("script", "lang", "package", "hint"),
        ),
        "status": {
            "enum": ["ok", "failed"],
            "description": "failed: every rung of the retry ladder failed.",
        },
        "attempts": {
            "type": "integer",
            "minimum": 1,
            "description": "How many rungs were tried (the entries of tries).",
        },
        "markdown": text_of(
            "The page's Markdown as the .md sidecar has it, figure links included; "
            "empty for a failed page."
        ),
        "raw": text_of(
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
        "tokens": object_of(
            "Token counts of the attempt kept.",
            {
                "prompt": {**COUNT, "description": "Prompt tokens (vLLM); null for Tesseract."},
                "completion": {**COUNT, "description": "Tokens made (vLLM); null for Tesseract."},
            },
        ),
        "seconds": object_of(
            "Where the page's time went, seconds.",
            {
                "render": {**SECONDS, "description": "Rendering the page image."},
                "orient": {
                    **SECONDS,
                    "description": "Orientation detection and deskew (0: neither asked for).",
                },
                "recognize": {**SECONDS, "description": "Every attempt together."},
            },
        ),
        "finish_reason": text_of(
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
