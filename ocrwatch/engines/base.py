"""The engine plug-in contract: one page image in, text and usage out.

Concurrency contract (every engine must honour it):
- ``start`` and ``close`` are called once each, from the daemon's event loop, never concurrently.
- ``recognize`` is a coroutine that may be called concurrently from many tasks; the engine bounds its own
  parallelism (``max_concurrency`` is a hint to the scheduler of how many pages it should keep in flight).
  It must never block the event loop: CPU or GPU work runs in threads, subprocesses or the engine's own process.
- ``abort`` may be called at any time for a request id that is in flight, finished or unknown; it must not
  raise for an unknown id. A recognize() whose request is aborted raises ``asyncio.CancelledError``.
- ``release`` is called after each document; it frees caches it can (gc, CUDA cache) and must be cheap.
- Errors: ``EngineFailed`` for a page-level failure, ``EngineDead`` when the engine must be rebuilt
  (the daemon then calls ``close`` and builds a new one), ``PageTimeout`` is raised by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image


@dataclass(frozen=True)
class RenderHint:
    """The page geometry an engine consumes, so the renderer produces no pixels the model throws away."""

    dpi: int
    max_side: int | None = None
    max_pixels: int | None = None


@dataclass(frozen=True)
class Sampling:
    """One rung of the page retry ladder."""

    temperature: float = 0.0
    ngram_size: int = 30
    window_size: int = 90
    max_tokens: int | None = None


@dataclass
class PageRequest:
    """One page for the engine; ``priority``: lower runs first; ``page_index`` is 0-based."""

    request_id: str
    image: Image.Image
    prompt: str
    priority: int = 0
    sampling: Sampling = field(default_factory=Sampling)
    page_index: int = 0


@dataclass
class Recognition:
    """What an engine returns for one page; ``raw`` keeps the model's exact output."""

    markdown: str
    raw: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    name: str
    render_hint: RenderHint
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
