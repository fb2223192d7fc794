"""The engine plug-in contract: one page image in, text and usage out.

Concurrency contract (every engine must honour it):
- ``start`` and ``close`` are called once each, from the daemon's event loop, never concurrently.
- ``recognize`` is a coroutine that may be called concurrently from many tasks; the engine bounds
  its own parallelism (``max_concurrency`` is a hint to the scheduler of how many pages it should
  keep in flight). It must never block the event loop: CPU or GPU work runs in threads, subprocesses
  or the engine's own process.
- ``abort`` may be called at any time for a request id that is in flight, finished or unknown; it
  must not raise for an unknown id. A recognize() whose request is aborted raises
  ``asyncio.CancelledError``.
- ``release`` is called after each document; it frees caches it can (gc, CUDA cache) and must be
  cheap.
- Errors: ``EngineFailed`` for a page-level failure, ``EngineDead`` when the engine must be rebuilt
  (the daemon then calls ``close`` and builds a new one), ``PageTimeout`` is raised by the caller.

An engine is found by name through the ``ocrwatch.engines`` entry-point group
(``engines.registry``): each entry point names an ``EngineSpec``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from PIL import Image
from pydantic import BaseModel

from ocrwatch.config import Config, EngineConfig, LogConfig, TextMode
from ocrwatch.engines.sampling import Sampling
from ocrwatch.pages.render import Geometry
from ocrwatch.plaintext import PlainText

Images = Literal["placeholder", "drop", "extract"]
"""What becomes of figures in the Markdown (``[output] images``); with ``extract`` an engine writes
the placeholder, which the assembler turns into a link to the figure's file."""


@dataclass
class PageRequest:
    """One page for the engine; ``priority``: lower runs first; ``page_index`` is 0-based; ``lang``:
    the languages its inbox or request names (``deu+eng``), which the engine spec's ``languages``
    checked at start; None for the engine's own; an engine that reads every language (vLLM) ignores
    it. ``script``: what orientation detection found the page written in (``Cyrillic``), by which
    Tesseract's ``lang = "auto"`` picks the page's language; None where it did not run."""

    request_id: str
    image: Image.Image
    prompt: str
    priority: int = 0
    sampling: Sampling = field(default_factory=Sampling)
    page_index: int = 0
    lang: str | None = None
    script: str | None = None


@dataclass
class Recognition:
    """What an engine returns for one page; ``raw`` keeps the model's exact output; ``blocks``: the
    page's pieces in reading order, each with its ``type``, ``text`` and ``bbox`` (page pixels)
    where the engine gives them, a figure named as ``is_figure`` says; ``plain``: set by an engine
    whose ``markdown`` is plain text (Tesseract), which the assembler escapes and whose line-break
    hyphens it joins; None (a model that writes Markdown) leaves the Markdown as the engine wrote
    it. ``lang``: the languages the engine read the page in, where it takes languages
    (Tesseract)."""

    markdown: str
    raw: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    plain: PlainText | None = None
    lang: str | None = None


def is_figure(block: Mapping[str, Any]) -> bool:
    """Whether one of a page's ``blocks`` is a figure: an image on the page, with no text of its
    own. An engine says so by naming it (``name``: ``page-N-figure-K``, from 1), the name its
    Markdown's placeholder ``![](page-N-figure-K)`` points to; the searchable PDF gives it no text,
    and ``[output] images = "extract"`` cuts it out as a file."""
    return bool(block.get("name"))


@runtime_checkable
class Engine(Protocol):
    name: str
    geometry: Geometry
    max_concurrency: int

    async def start(self) -> None:
        """Load the model and warm it up; return only when a page can be recognised."""

    async def recognize(self, page: PageRequest) -> Recognition:
        """Recognise one page; see the module docstring for the concurrency contract."""

    async def abort(self, request_id: str) -> None:
        """Cancel an in-flight request; a no-op for an unknown id."""

    def release(self) -> None:
        """Free what a finished document left behind."""

    async def close(self) -> None:
        """Stop the engine and free its resources."""

    def describe(self) -> dict[str, Any]:
        """Name, model, revision and settings, recorded in every JSON sidecar."""


@dataclass(frozen=True)
class Check:
    """One line of ``ocrwatch check``: what was checked (naming the configuration key where there is
    one), what was found, and for a failure what to do about it."""

    ok: bool
    what: str
    detail: str
    hint: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok   {self.what} {self.detail}"
        return f"FAIL {self.what}: {self.detail}" + (f": {self.hint}" if self.hint else "")


Wanted = list[tuple[str, str]]
"""Languages to check, each with the key (or option) that asked for it:
``("inbox[0].lang", "deu")``."""

Checks = Callable[[Config, bool, Wanted | None], Iterator[Check]]
"""An engine's own checks of ``cfg``: with ``probe`` (``ocrwatch check``) also what only matters to
``check``; with languages, those instead of the configured ones."""

Trial = Literal["start", "build", "none"]
"""What ``ocrwatch check`` does with the engine once its checks pass: start it on a test page, only
build it, or neither (a model that takes minutes to load)."""


COMMAND_TIMEOUT = 30.0
"""Seconds a probing command (``pdftoppm -v``, ``tesseract --list-langs``) may take."""


def command_output(command: list[str]) -> str | None:
    """stdout and stderr of a short command, or None when it could not run or failed."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def no_checks(cfg: Config, probe: bool, wanted: Wanted | None) -> Iterator[Check]:
    """The checks of an engine that brings none."""
    return iter(())


Judge = Callable[[Recognition], str | None]
"""Why an engine's output for a page should be tried again on the next rung (``"loop"``), or None
when it is final."""


def accept(rec: Recognition) -> str | None:
    """Every output is final: the judge of an engine that cannot loop, where repeated text on a
    page is real."""
    return None


def one_rung(cfg: EngineConfig) -> list[Sampling]:
    """One attempt at the default sampling: for an engine with no sampling to change."""
    return [Sampling()]


def accepting(cfg: EngineConfig) -> Judge:
    """``accept``, whatever the options: for an engine whose output never needs a second try."""
    return accept


def runs_anywhere() -> tuple[bool, str]:
    """An engine that needs nothing a host may lack (its package is installed, as its entry point
    is)."""
    return True, ""


def always_installed() -> bool:
    """An engine whose entry point is found is installed."""
    return True


Build = Callable[[EngineConfig, Images, LogConfig | None], Engine]
"""Builds (does not start) an engine from ``[engine]``; the log settings reach engines that run
processes of their own."""


@dataclass(frozen=True)
class EngineSpec:
    """What an ``ocrwatch.engines`` entry point names: the engine's ``[engine] kind`` and how to
    build it. Its ``options`` are its own table under ``[engine]`` (``[engine.vllm]``), validated
    through that model; ``kind = "plugin"`` reads ``plugin_args`` instead. ``text``: the engine's
    default ``[[inbox]] text``, where an inbox sets none: ``auto`` where a good text layer reads as
    well as the engine would, ``ocr`` where the engine gives more (DeepSeek's Markdown keeps the
    structure a text layer lacks)."""

    name: str
    build: Build
    text: TextMode = "ocr"
    options: type[BaseModel] | None = None
    """The model of its ``[engine.<name>]`` table; None: the engine takes no table."""
    checks: Checks = no_checks
    languages: Callable[[Any], frozenset[str]] | None = None
    """The languages it can read under its options (Tesseract: its installed language data); None:
    it takes no language."""
    trial: Trial = "build"
    rungs: Callable[[EngineConfig], list[Sampling]] = one_rung
    """The page ladder's attempts under its options, each a ``Sampling``: the first, then the
    retries of a page that failed or that ``judge`` sent back."""
    judge: Callable[[EngineConfig], Judge] = accepting
    """The judge of its output under its options."""
    prompted: bool = True
    """Whether it reads the request's prompt and samples its output as ``Sampling`` says (a model);
    False (Tesseract): the sidecar records neither the prompt nor a try's sampling."""
    auto: int | None = None
    """Its place in the order ``[engine] kind = "auto"`` tries engines in (lowest first; ocrwatch's
    own engines' tables are documented in this order too); None: ``auto`` never chooses it."""
    runs_here: Callable[[], tuple[bool, str]] = runs_anywhere
    """Whether it can run on this host, and why (not), in the words ``auto``'s reason quotes:
    ``auto`` takes the first engine in its order that can."""
    installed: Callable[[], bool] = always_installed
    """Whether what it needs is installed, even where it cannot run here: ``auto`` passing over an
    installed engine warns (whoever installed it wants it), passing over one not installed is what
    ``auto`` means."""
