"""The Tesseract engine: CPU OCR through the ``tesseract`` command, one subprocess per page.

Each page is encoded as PNM (no compression to wait for), piped to ``tesseract - - ... tsv`` on
stdin, in the languages of its request (its inbox's ``lang``) or else ``[engine.tesseract] lang``
(``auto``: the installed language of the script orientation detection found on the page,
``osd.language``), and the TSV answer gives both the text (paragraphs separated by blank lines;
plain, so ``PlainText`` goes with it, with the languages' dictionary for the assembler's hyphen
joining) and line blocks with boxes, each with its words and their boxes (what a searchable PDF
places), from one run. No temporary files, so nothing to clean up after a kill.

Concurrency: at most ``max_concurrency`` children run at once (``[engine.tesseract] workers``,
"auto" = one per core), each with ``OMP_THREAD_LIMIT=1`` so the cores are not oversubscribed by
Tesseract's own threads. A page runs in its own task: ``abort`` cancels that task, whose cleanup
kills and reaps the child, and the caller's ``recognize`` raises ``CancelledError``; cancelling the
caller cancels the page task the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from PIL import Image, ImageDraw

from ocrwatch import plaintext
from ocrwatch.config import EngineConfig, LogConfig
from ocrwatch.engines import tesseract_checks
from ocrwatch.engines.base import Engine, EngineSpec, Images, PageRequest, Recognition
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import ConfigError, EngineDead, EngineFailed
from ocrwatch.pages import osd
from ocrwatch.pages.render import Geometry

log = structlog.get_logger()

STDERR_TAIL = 2000
_TSV_COLUMNS = 12


@dataclass
class _Line:
    paragraph: int
    words: list[dict[str, Any]]
    box: list[int]


class TesseractEngine:
    """Recognises page images with the Tesseract CLI; see the module docstring for concurrency."""

    name = "tesseract"

    def __init__(self, config: TesseractConfig) -> None:
        self._config = config
        auto = os.cpu_count() or 1
        self.max_concurrency = config.workers if isinstance(config.workers, int) else auto
        self.geometry = Geometry(dpi=config.dpi)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._pages: dict[str, asyncio.Task[Recognition]] = {}
        self._env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        self._version = "unknown"
        self._tessdata: Path | None = None
        self._installed: frozenset[str] = frozenset()
        self._plain: dict[str, plaintext.PlainText] = {}  # by languages (``deu+eng``)
        self._reading = asyncio.Lock()

    async def start(self) -> None:
        """Check the binary and the language data, then OCR a tiny page so the first real one is not
        the one that finds out Tesseract cannot run."""
        binary = self._config.binary
        if shutil.which(binary) is None:
            raise ConfigError(
                f"tesseract binary {binary!r} not found",
                hint="install the Debian package tesseract-ocr (apt-get install tesseract-ocr), "
                "or set [engine.tesseract] binary to its path",
            )
        if self._config.psm == 0:
            raise ConfigError(
                "[engine.tesseract] psm 0 only detects orientation and recognises no text"
            )
        version = (await self._run_command("--version")).split()
        self._version = version[1] if len(version) > 1 and version[0] == "tesseract" else "unknown"
        listing = await self._run_command("--list-langs")
        available = set(listing.splitlines()[1:])
        self._installed = frozenset(available)
        self._tessdata = plaintext.tessdata_dir(listing)
        wanted = osd.FALLBACK if self._config.lang == osd.AUTO else self._config.lang
        missing = [lang for lang in wanted.split("+") if lang not in available]
        if missing:
            packages = " ".join(
                f"tesseract-ocr-{lang.lower().replace('_', '-')}" for lang in missing
            )
            raise ConfigError(
                "[engine.tesseract] lang: tesseract has no language data for "
                f"{', '.join(missing)}; "
                f"installed: {', '.join(sorted(available))}",
                hint=f"install the Debian package(s) {packages}, or change [engine.tesseract] lang",
            )
        missing_tools = plaintext.tools_missing()
        if missing_tools:
            log.info(
                "tesseract.no_wordlist",
                missing=missing_tools,
                reason="hyphens joined by the page's words only",
            )
        await self.recognize(
            PageRequest(request_id="tesseract-warmup", image=_warmup_page(), prompt="")
        )
        log.info(
            "tesseract.started",
            version=self._version,
            lang=self._config.lang,
            workers=self.max_concurrency,
            words=len(self._plain[self._language(self._config.lang, None)].known),
        )

    async def recognize(self, page: PageRequest) -> Recognition:
        """OCR one page in its own task, so ``abort`` can cancel exactly this page."""
        task = asyncio.ensure_future(self._recognize(page))
        self._pages[page.request_id] = task
        try:
            return await task
        finally:
            if self._pages.get(page.request_id) is task:
                del self._pages[page.request_id]

    async def abort(self, request_id: str) -> None:
        task = self._pages.get(request_id)
        if task is not None and not task.done():
            task.cancel()
            log.info("tesseract.aborted", request_id=request_id)

    def release(self) -> None:
        """Nothing to free: every page's memory goes with its subprocess."""

    async def close(self) -> None:
        """Kill whatever still runs, and wait until those children are reaped."""
        tasks = [task for task in self._pages.values() if not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self._version,
            "lang": self._config.lang,
            "psm": self._config.psm,
            "dpi": self._config.dpi,
            "workers": self.max_concurrency,
        }

    async def _recognize(self, page: PageRequest) -> Recognition:
        queued = time.monotonic()
        lang = self._language(page.lang or self._config.lang, page.script)
        plain = await self._plain_text(lang)
        async with self._slots:
            started = time.monotonic()
            payload, dpi = await asyncio.to_thread(_encode, page.image, self._config.dpi)
            encoded = time.monotonic()
            tsv = await self._run_page(page.request_id, payload, dpi, lang)
        finished = time.monotonic()
        markdown, blocks = parse_tsv(tsv)
        return Recognition(
            markdown=markdown,
            raw=markdown,
            blocks=blocks,
            finish_reason="stop",
            seconds=finished - started,
            timings={
                "queue": started - queued,
                "encode": encoded - started,
                "ocr": finished - encoded,
            },
            plain=plain,
            lang=lang,
        )

    def _language(self, lang: str, script: str | None) -> str:
        """``lang``, or for ``auto`` the installed language of the page's ``script``."""
        return osd.language(script, self._installed)[0] if lang == osd.AUTO else lang

    async def _plain_text(self, lang: str) -> plaintext.PlainText:
        """What goes with the text of ``lang``: its dictionary, read once per engine and languages
        (in a thread: half a second a language); without one (no tools, no word list), the page's
        own words decide."""
        async with self._reading:
            found = self._plain.get(lang)
            if found is None:
                words: frozenset[str] = frozenset()
                if self._tessdata is not None:
                    try:
                        words = await asyncio.to_thread(plaintext.wordlist, self._tessdata, lang)
                    except (OSError, subprocess.SubprocessError) as exc:
                        log.warning("tesseract.wordlist_failed", lang=lang, error=str(exc))
                found = self._plain[lang] = plaintext.PlainText(words)
            return found

    async def _run_page(self, request_id: str, payload: bytes, dpi: int, lang: str) -> str:
        command = [
            self._config.binary,
            "-",
            "-",
            "--dpi",
            str(dpi),
            "-l",
            lang,
            "--psm",
            str(self._config.psm),
            "tsv",
        ]
        stdout, stderr, returncode = await self._communicate(command, payload)
        if returncode != 0:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
            log.warning(
                "tesseract.page_failed", request_id=request_id, returncode=returncode, stderr=tail
            )
            raise EngineFailed(f"tesseract exited with status {returncode}: {tail}")
        return stdout.decode(errors="replace")

    async def _run_command(self, *args: str) -> str:
        stdout, stderr, returncode = await self._communicate([self._config.binary, *args], b"")
        if returncode != 0:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
            raise EngineDead(
                f"{self._config.binary} {' '.join(args)} failed with status {returncode}: {tail}"
            )
        return stdout.decode(errors="replace")

    async def _communicate(self, command: list[str], payload: bytes) -> tuple[bytes, bytes, int]:
        """Run one child to completion; if the awaiting task is cancelled, kill the child and reap
        it before the cancellation goes on, so no Tesseract outlives its page."""
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        )
        try:
            process = await asyncio.shield(spawn)
        except OSError as exc:  # the binary vanished or cannot run (package upgrade, no memory)
            raise EngineDead(f"cannot run {command[0]}: {exc}") from exc
        except asyncio.CancelledError:  # cancelled while the child was being made: it exists
            with contextlib.suppress(OSError):
                await _reaped(await _finished(spawn))
            raise
        # 3.10 logs the broken stdin pipe of a killed child that nobody awaited
        if sys.version_info < (3, 11):
            closed = process._protocol._stdin_closed  # type: ignore[attr-defined]
            closed.add_done_callback(lambda future: future.cancelled() or future.exception())
        try:
            stdout, stderr = await process.communicate(payload)
        except BaseException:
            await _reaped(process)
            raise
        return stdout, stderr, await process.wait()


async def _finished(future: asyncio.Future[Any]) -> Any:
    """``future``'s result, awaited through any further cancellation of the awaiting task."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(future)
    return future.result()


async def _reaped(process: asyncio.subprocess.Process) -> None:
    """The child killed, where it still runs, and reaped before the loop may close: a child that
    exits after its loop closed is never reaped, and asyncio logs it."""
    if process.returncode is None:
        process.kill()
        await _finished(asyncio.ensure_future(process.wait()))


def parse_tsv(tsv: str) -> tuple[str, list[dict[str, Any]]]:
    """Markdown and line blocks from Tesseract's TSV: words joined into lines, lines into
    paragraphs, paragraphs separated by a blank line. Each line block keeps its words (text, box,
    confidence), the finest level Tesseract gives, and its paragraph's number on the page (1-based);
    a line's box is the union of its words' boxes."""
    paragraphs: dict[tuple[str, ...], list[_Line]] = {}
    lines: dict[tuple[str, ...], _Line] = {}
    for row in tsv.splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) != _TSV_COLUMNS or fields[0] != "5" or not fields[11].strip():
            continue
        left, top, width, height = (int(value) for value in fields[6:10])
        box = [left, top, left + width, top + height]
        line = lines.get(tuple(fields[1:5]))
        if line is None:
            group = paragraphs.setdefault(tuple(fields[1:4]), [])
            # The TSV walks its tree in order, so a new line belongs to the paragraph seen last.
            line = lines[tuple(fields[1:5])] = _Line(len(paragraphs), [], box)
            group.append(line)
        line.words.append(
            {"text": fields[11].strip(), "bbox": box, "conf": round(float(fields[10]), 1)}
        )
        line.box = [*map(min, line.box[:2], box[:2]), *map(max, line.box[2:], box[2:])]
    markdown = "\n\n".join(
        "\n".join(" ".join(word["text"] for word in line.words) for line in group)
        for group in paragraphs.values()
    )
    blocks = [
        {
            "type": "line",
            "text": " ".join(word["text"] for word in line.words),
            "bbox": line.box,
            "conf": round(sum(word["conf"] for word in line.words) / len(line.words), 1),
            "paragraph": line.paragraph,
            "words": line.words,
        }
        for line in lines.values()
    ]
    return markdown, blocks


def _encode(image: Image.Image, default_dpi: int) -> tuple[bytes, int]:
    """PNM bytes Tesseract reads from stdin, and the image's DPI: the renderer's (every page it
    makes records it), within the range Tesseract believes (it takes 70 for less, with a warning);
    ``default_dpi`` for an image that records none. The renderer already hands over L or RGB;
    other modes are flattened here the same way."""
    dpi = image.info.get("dpi")
    first = float(dpi[0]) if isinstance(dpi, tuple) and dpi else 0.0
    resolution = min(max(round(first), 70), 2400) if first > 0 else default_dpi
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":  # 16-bit grey: convert("L") would clip at 255
        image = image.convert("I").point(lambda value: value * (1 / 257)).convert("L")
    elif mode in ("RGBA", "RGBa", "LA", "La", "PA") or (
        mode == "P" and "transparency" in image.info
    ):
        white = Image.new("RGBA", image.size, "white")
        image = Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    elif mode not in ("1", "L", "RGB"):
        image = image.convert("RGB")
    # Always an image Pillow just wrote: Tesseract reads stdin that is no image as a list of file
    # names.
    buffer = io.BytesIO()
    image.save(buffer, format="PPM")
    return buffer.getvalue(), resolution


def _warmup_page() -> Image.Image:
    image = Image.new("L", (240, 80), 255)
    ImageDraw.Draw(image).text((20, 30), "ocrwatch", fill=0)
    return image


def _build(cfg: EngineConfig, images: Images, log: LogConfig | None) -> Engine:
    return TesseractEngine(cfg.tesseract)


SPEC = EngineSpec(  # its plain text is what a good layer holds: text "auto"
    "tesseract",
    _build,
    text="auto",
    options=TesseractConfig,
    checks=tesseract_checks.checks,
    languages=tesseract_checks.languages,
    trial="start",
    prompted=False,
    auto=1,  # tried next by auto: it runs on any CPU
    runs_here=lambda: (True, "Tesseract runs on the CPU"),
)
"""Entry point ``ocrwatch.engines: tesseract``."""
