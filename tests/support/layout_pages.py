"""Pages for the ALTO and hOCR tests: a small page Tesseract reads at test time, a DeepSeek-OCR page
through the engine's own grounding parser, and the official ALTO 4.4 schema (skipped without it)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrwatch.engines.base import Recognition
from ocrwatch.engines.deepseek.grounding import parse
from ocrwatch.engines.tesseract import parse_tsv
from ocrwatch.pages import orientation
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.plaintext import PlainText
from ocrwatch.recognize.ladder import PageResult

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "alto-4-4.xsd"
SIZE = (900, 260)  # the page as Tesseract reads it, upright, at DPI
DPI = 150
LINES = ["Invoice 4711 was paid", "on 12 March 2024."]
DEEPSEEK_SIZE = (1000, 1400)
DEEPSEEK = (
    "<|ref|>title<|/ref|><|det|>[[172, 92, 826, 140]]<|/det|>\n"
    "# Watching Folders & Documents  \n\n"
    "<|ref|>text<|/ref|><|det|>[[114, 311, 884, 458]]<|/det|>\n"
    "We describe a daemon.\nIt renders pages.  \n\n"
    "<|ref|>image<|/ref|><|det|>[[131, 470, 863, 640]]<|/det|>\n\n"
    "<|ref|>table<|/ref|><|det|>[[100, 700, 900, 800]]<|/det|>\n"
    "<table><tr><td>name</td><td>value</td></tr><tr><td>x</td><td>1</td></tr></table>"
)


def alto_schema() -> Any:
    """The ALTO 4.4 schema as lxml validates with it; the test is skipped where it is absent."""
    if not SCHEMA.is_file():
        pytest.skip(f"the ALTO schema {SCHEMA} is absent")
    from lxml import etree

    return etree.XMLSchema(etree.parse(str(SCHEMA)))


def tesseract_blocks() -> list[dict[str, Any]]:
    """Tesseract's line blocks (its words, boxes, confidences) for a page drawn now, as the engine
    parses them."""
    return tesseract_read()[1]


def tesseract_read() -> tuple[str, list[dict[str, Any]]]:
    """Tesseract's Markdown and line blocks for a page drawn now, as the engine parses them."""
    if shutil.which("tesseract") is None:
        pytest.skip("tesseract is not installed")
    image = Image.new("L", SIZE, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=44)
    for number, line in enumerate(LINES):
        draw.text((40, 40 + 100 * number), line, font=font, fill="black")
    done = subprocess.run(
        ["tesseract", "-", "-", "--dpi", str(DPI), "--psm", "6", "tsv"],
        input=_pnm(image),
        capture_output=True,
        check=True,
        env={"OMP_THREAD_LIMIT": "1", "PATH": "/usr/bin:/bin"},
    )
    return parse_tsv(done.stdout.decode())


def outcome(
    blocks: list[dict[str, Any]],
    size: tuple[int, int] = SIZE,
    turned: orientation.Orientation = orientation.AS_RENDERED,
    *,
    markdown: str = "",
    status: str = "ok",
    plain: PlainText | None = None,
    index: int = 0,
    dpi_from: str = "render",
) -> PageOutcome:
    """A finished page that recognition gave these blocks (``size``: upright, as read)."""
    recognition = Recognition(markdown=markdown, raw=markdown, blocks=blocks, plain=plain)
    result = PageResult(status, recognition, [])  # type: ignore[arg-type]
    return PageOutcome(index, *size, DPI, 0.1, result, dpi_from=dpi_from, orientation=turned)


def deepseek_outcome(index: int = 0) -> PageOutcome:
    """A DeepSeek-OCR page: its grounding output through the engine's own parser."""
    parsed = parse(DEEPSEEK, *DEEPSEEK_SIZE, page_index=index)
    return outcome(parsed.blocks, DEEPSEEK_SIZE, markdown=parsed.markdown, index=index)


def words(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [word for block in blocks for word in block["words"]]


def _pnm(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PPM")
    return buffer.getvalue()
