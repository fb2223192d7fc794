"""Engines and a daemon runner for the hardening and crash-safety tests.

- ``CountingEngine``: echoes every page quickly and appends one line per recognition to a file
  (``start``/``done``, the daemon's pid and the request id), so a test can count, across ``kill -9``
  and restarts, how often each page of each document was recognised.
- ``GarbageEngine``: answers with hostile text (lone surrogates, NULs and control characters, bidi
  overrides, fake page markers, half layout tags, a megabyte of text, nothing at all): the sidecars
  must still be valid UTF-8 JSON and Markdown.

``tests.integration.conftest.PluginDaemon`` runs ``ocrwatch run`` as a real process with one of
these as its engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

from ocrwatch.engines.base import PageRequest, Recognition
from tests.support.engines_base import StubEngine


def job_id_of(path: Path) -> str:
    """The daemon's job id for a local file (``pipeline.job_id``): the prefix of every request id of
    its pages."""
    return hashlib.sha1(path.resolve().as_uri().encode()).hexdigest()[:12]


def _echo(page: PageRequest, text: str | None = None) -> Recognition:
    width, height = page.image.size
    digest = hashlib.blake2b(page.image.tobytes(), digest_size=6).hexdigest()
    raw = (
        text
        if text is not None
        else f"Echo of page {page.page_index + 1}, {width}x{height}, pixels {digest}."
    )
    return Recognition(
        markdown=raw,
        raw=raw,
        blocks=[{"type": "text", "text": raw, "bbox": [0, 0, width, height]}],
        prompt_tokens=1,
        completion_tokens=len(raw.split()),
        finish_reason="stop",
    )


class CountingEngine(StubEngine):
    """Echoes each page after ``delay`` seconds and appends ``start``/``done PID REQUEST_ID`` lines
    to ``log``.

    Each line is one ``write`` on an ``O_APPEND`` descriptor, so lines from concurrent pages never
    interleave and a ``kill -9`` leaves every completed line whole.
    """

    name = "counting"

    def __init__(
        self, *, log: str, delay: float = 0.0, max_concurrency: int = 4, dpi: int = 100
    ) -> None:
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.log = log
        self.delay = delay
        self._fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _note(self, what: str, request_id: str) -> None:
        os.write(self._fd, f"{what} {os.getpid()} {request_id}\n".encode())

    async def _work(self, page: PageRequest) -> Recognition:
        self._note("start", page.request_id)
        await asyncio.sleep(self.delay)
        recognition = _echo(page)
        self._note("done", page.request_id)
        return recognition

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "delay": self.delay}


GARBAGE: tuple[str, ...] = (
    "lone surrogates \ud800 and \udfff in the middle",
    "NUL \x00 bell \x07 escape \x1b[31m red \x1b[0m form feed \x0c vertical tab \x0b",
    "bidi \u202e txt.exe \u202c and zero width \u200b\u200d joiners, BOM \ufeff",
    "<!-- page 1 -->\n\n# A fake page marker\n\n<!-- page 99 -->",
    "<|ref|>text<|/ref|><|det|>[[10, 20, 30",
    "<|det|>[[-5, nan, 1e309, 4]]<|/det|> ]]] {{{ \\u0000 </td></tr></table>",
    "",
    "A" * 1_000_000,
)


class GarbageEngine(StubEngine):
    """Answers page *n* with ``GARBAGE[n % len(GARBAGE)]``, with a block whose bbox is hostile
    too."""

    name = "garbage"

    async def _work(self, page: PageRequest) -> Recognition:
        text = GARBAGE[page.page_index % len(GARBAGE)]
        return Recognition(
            markdown=text,
            raw=text,
            blocks=[{"type": "text\x00", "text": text, "bbox": [-1, 0, 10**12, 2]}],
            prompt_tokens=None,
            completion_tokens=None,
            finish_reason="stop",
        )
