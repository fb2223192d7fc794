"""A document's further outputs, made before its sidecars are written: the searchable PDF, the ALTO
and hOCR files (``[output] formats``) and the figures.

``prepare`` returns what the sink writes ahead of the JSON (``files``: names relative to the
sidecars' folder or key prefix, as bytes or as a file in the job's spool folder), the JSON members
that describe them (``searchable_pdf``, ``alto``, ``hocr``, ``figures``: each file's path relative
to the JSON, its size and sha256; the searchable PDF's ``text_layer``, one per page: ``own``,
``ocr`` or ``none``, and ``text_layer_skipped`` when a page got none because its content could not
be read within bounds: the page's number, the reason and a message) and the folder the Markdown
links the figures into.
The searchable PDF is built from the job's private copy, the bytes that were rendered, in a worker
thread, decoding within the pipeline's one ``DecodeBudget``. A source whose text layer cannot be
built (a PDF qpdf cannot read, one that needs a password to change) still gets its Markdown and
JSON: the JSON says why, and the log does too; only a fault of the place (the spool folder full) is
raised, so the document is tried again once it passes.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from ocrwatch.config import SIDECARS, OutputConfig
from ocrwatch.errors import PlaceFault, classify
from ocrwatch.infra.memory import UNBOUNDED, DecodeBudget
from ocrwatch.naming import output_names
from ocrwatch.pages.render import Spooled
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.results import alto, hocr, positions, textlayer
from ocrwatch.results.assemble import iso
from ocrwatch.safefs import sha256_file
from ocrwatch.sources.base import LocalFile, Origin

log = structlog.get_logger()

SPOOL_NAME = "searchable.pdf"


@dataclass(frozen=True)
class Outputs:
    files: dict[str, bytes | Path] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    assets: str | None = None


NONE = Outputs()


async def prepare(
    output: OutputConfig,
    origin: Origin,
    copy: Spooled,
    pages: Sequence[PageOutcome],
    spool_dir: Path,
    stages: dict[str, float],
    budget: DecodeBudget = UNBOUNDED,
    formats: Collection[str] = SIDECARS,
    engine: Mapping[str, Any] | None = None,
) -> Outputs:
    """The outputs ``[output]`` asks for, for the document ``origin`` whose private copy is
    ``copy``. The searchable PDF's build time goes into ``stages``; what it decodes is held within
    ``budget``. ``formats``: the job's (its inbox's or bucket's, else ``[output]``'s); ``engine``:
    what read it, as the JSON describes it."""
    names = output_names(origin.name, output.name_template)
    source = copy.path
    result = Outputs()
    if output.searchable_pdf:
        started = time.monotonic()
        out = spool_dir / SPOOL_NAME
        try:
            digest, size, layers = await asyncio.to_thread(
                _build, source, copy.info.kind, pages, out, copy.sha256, budget
            )
        except Exception as exc:
            error = classify(exc)
            if isinstance(error, PlaceFault):
                raise
            shown = str(origin.path) if isinstance(origin, LocalFile) else origin.uri
            error.message = error.message.replace(str(source), shown)
            log.warning("searchable_pdf_failed", kind=error.kind, error=error.message)
            result.sections["searchable_pdf"] = {"error": error.as_dict()}
        else:
            result.files[names["pdf"]] = out
            result.sections["searchable_pdf"] = {
                "path": names["pdf"],
                "bytes": size,
                "sha256": digest,
                "text_layer": layers.pages,
            }
            if layers.skipped:
                result.sections["searchable_pdf"]["text_layer_skipped"] = layers.skipped
                for skipped in layers.skipped:
                    log.warning("text_layer_skipped", **skipped)
        stages["searchable_pdf"] = time.monotonic() - started
    if "alto" in formats or "hocr" in formats:
        started = time.monotonic()
        made = await asyncio.to_thread(_layouts, formats, origin.name, pages, engine or {})
        for kind, data in made.items():
            result.files[names[kind]] = data
            result.sections[kind] = {
                "path": names[kind],
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        stages["layouts"] = time.monotonic() - started
    if output.images == "extract":
        result = Outputs(result.files, result.sections, names["assets"])
        listed = []
        for outcome in pages:
            for figure in outcome.figures:
                path = f"{names['assets']}/{figure.file}"
                result.files[path] = figure.png
                listed.append(
                    {
                        "page": figure.page,
                        "name": figure.name,
                        "bbox": list(figure.bbox),
                        "path": path,
                        "bytes": len(figure.png),
                        "sha256": hashlib.sha256(figure.png).hexdigest(),
                    }
                )
        result.sections["figures"] = listed
    return result


def _layouts(
    formats: Collection[str], source: str, pages: Sequence[PageOutcome], engine: Mapping[str, Any]
) -> dict[str, bytes]:
    """The ALTO and hOCR files ``formats`` names, by kind."""
    read = positions.pages(pages)
    made = {}
    if "alto" in formats:
        made["alto"] = alto.document(read, source, engine, iso(time.time()) or "")
    if "hocr" in formats:
        made["hocr"] = hocr.document(read, source, engine)
    return made


def _shown_points(page: PageOutcome) -> tuple[float, float] | None:
    """The page's size in points as rendered: the sidecar's width and height are the page as read,
    which a right-angle turn swapped."""
    if not page.dpi:
        return None
    width, height = page.width * 72 / page.dpi, page.height * 72 / page.dpi
    return (height, width) if page.orientation.rotation in (90, 270) else (width, height)


def _build(
    source: Path,
    kind: Literal["pdf", "image"],
    pages: Sequence[PageOutcome],
    out: Path,
    sha256: str,
    budget: DecodeBudget,
) -> tuple[str, int, textlayer.Layers]:
    """Write the searchable PDF to ``out``; its sha256, size and each page's text layer. Failed
    pages keep their page and get no text; an image's pages are the size the sidecar records (pixels
    at its DPI)."""
    texts = [
        textlayer.page_text(
            page.width, page.height, page.result.recognition.blocks, page.orientation
        )
        if page.result.status == "ok" and page.result.recognition is not None
        else None
        for page in pages
    ]
    sizes = [_shown_points(page) for page in pages]
    layers = textlayer.searchable_pdf(source, kind, texts, out, sha256, budget=budget, sizes=sizes)
    return sha256_file(out), out.stat().st_size, layers
