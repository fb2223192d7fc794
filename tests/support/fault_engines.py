"""Tiny fault-injecting engines for the daemon's tests, after OCRmyPDF's ``tesseract_crash.py``.

Each class is a ``tests.support.engines_base.StubEngine`` (the protocol's plumbing) with a page's
work of
its own, and
is built from keyword arguments only, so a configuration can name it::

    [engine]
    kind = "plugin"
    plugin = "tests.support.fault_engines:CrashingEngine"
    plugin_args = { every = 3 }

- ``EchoEngine``: deterministic text from the page's pixels, quickly (scheduler and daemon tests);
  ``start_delay`` stands for an engine that takes long to start, ``start_command`` for one that
  starts a process of its own (vLLM's engine core).
- ``CrashingEngine``: ``EngineDead`` on every Nth page, counted across the process, so a rebuilt
  engine carries on counting and a requeued page succeeds; a dead engine fails its in-flight pages
  too. With ``error = "failed"`` it raises ``EngineFailed`` for that page instead and lives on.
- ``HangingEngine``: never answers pages whose request id matches; honours ``abort``.
- ``LoopingEngine``: looping output for matching pages, only at temperature 0 (the ladder recovers)
  or always.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import subprocess
from typing import Any, Literal

from PIL import Image

from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.errors import EngineDead, EngineFailed
from tests.support.engines_base import StubEngine

_crash_calls = itertools.count(1)

LOOP_UNIT = "The same sentence comes back again and again. "


def reset_crash_count() -> None:
    """Start ``CrashingEngine``'s process-wide page count again (call it in a fixture)."""
    global _crash_calls
    _crash_calls = itertools.count(1)


def _digest(image: Image.Image) -> str:
    return hashlib.blake2b(image.tobytes(), digest_size=6).hexdigest()


async def _echo(page: PageRequest, text: str | None = None) -> Recognition:
    width, height = page.image.size
    raw = (
        text
        if text is not None
        else f"Echo of a {width}x{height} page, pixels "
        f"{await asyncio.to_thread(_digest, page.image)}."
    )
    return Recognition(
        markdown=raw,
        raw=raw,
        blocks=[{"type": "text", "text": raw, "bbox": [0, 0, width, height]}],
        prompt_tokens=1,
        completion_tokens=len(raw.split()),
        finish_reason="stop",
    )


class EchoEngine(StubEngine):
    """Answers every page after ``delay`` seconds with text derived from its pixels (or
    ``text``)."""

    name = "echo"

    def __init__(
        self,
        *,
        delay: float = 0.0,
        max_concurrency: int = 8,
        dpi: int = 100,
        text: str | None = None,
        start_delay: float = 0.0,
        start_command: list[str] | None = None,
    ) -> None:
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.delay = delay
        self.start_delay = start_delay
        self.start_command = start_command
        self.helper: subprocess.Popen[bytes] | None = None
        self.text = text
        self.started = False
        self.releases = 0

    async def start(self) -> None:
        if self.start_command:
            self.helper = subprocess.Popen(self.start_command)
        await asyncio.sleep(self.start_delay)
        self.started = True

    async def _work(self, page: PageRequest) -> Recognition:
        await asyncio.sleep(self.delay)
        return await _echo(page, self.text)

    def release(self) -> None:
        self.releases += 1

    async def close(self) -> None:
        await super().close()
        if self.helper is not None:
            self.helper.terminate()
            self.helper.wait()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "delay": self.delay}


class CrashingEngine(StubEngine):
    """Dies (``EngineDead``) on every ``every``-th page of the process; then fails everything until
    closed. With ``error="failed"`` only that page fails (``EngineFailed``)."""

    name = "crashing"

    def __init__(
        self,
        *,
        every: int = 3,
        error: Literal["dead", "failed"] = "dead",
        delay: float = 0.0,
        max_concurrency: int = 4,
        dpi: int = 100,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        if error not in ("dead", "failed"):
            raise ValueError("error must be 'dead' or 'failed'")
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.every = every
        self.error = error
        self.delay = delay
        self.dead = False
        self._died = asyncio.Event()

    async def start(self) -> None:
        self._died = asyncio.Event()

    async def _work(self, page: PageRequest) -> Recognition:
        if self.dead:
            raise EngineDead("simulated engine is dead")
        call = next(_crash_calls)
        if call % self.every == 0 and self.error == "failed":
            raise EngineFailed(f"simulated page failure on page call {call} ({page.request_id})")
        if call % self.every == 0:
            self.dead = True
            self._died.set()
            raise EngineDead(f"simulated crash on page call {call} ({page.request_id})")
        try:
            await asyncio.wait_for(self._died.wait(), timeout=self.delay)
        except asyncio.TimeoutError:
            return await _echo(page)
        raise EngineDead(f"simulated engine died while {page.request_id} was in flight")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "every": self.every, "error": self.error}


class HangingEngine(StubEngine):
    """Never answers pages whose request id matches ``match`` (a regex; every ``every``-th such page
    when ``every`` > 0); the rest are echoed after ``delay``. Only ``abort`` or cancellation ends a
    hung page."""

    name = "hanging"

    def __init__(
        self,
        *,
        match: str = "",
        every: int = 0,
        delay: float = 0.0,
        max_concurrency: int = 4,
        dpi: int = 100,
    ) -> None:
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.match = re.compile(match)
        self.every = every
        self.delay = delay
        self._matches = itertools.count(1)
        self.hung: list[str] = []

    def _hangs(self, request_id: str) -> bool:
        if self.match.search(request_id) is None:
            return False
        return self.every <= 0 or next(self._matches) % self.every == 0

    async def _work(self, page: PageRequest) -> Recognition:
        if self._hangs(page.request_id):
            self.hung.append(page.request_id)
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay)
        return await _echo(page)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "match": self.match.pattern, "every": self.every}


class LoopingEngine(StubEngine):
    """Returns a repetition loop for pages matching ``match``: at temperature 0 only
    (``mode="greedy"``, so the ladder's next rung recovers) or on every rung (``mode="always"``, so
    the page fails)."""

    name = "looping"

    def __init__(
        self,
        *,
        mode: Literal["greedy", "always"] = "greedy",
        match: str = "",
        finish_reason: str = "stop",
        repeats: int = 60,
        delay: float = 0.0,
        max_concurrency: int = 4,
        dpi: int = 100,
    ) -> None:
        if mode not in ("greedy", "always"):
            raise ValueError("mode must be 'greedy' or 'always'")
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.mode = mode
        self.match = re.compile(match)
        self.finish_reason = finish_reason
        self.repeats = repeats
        self.delay = delay
        self.temperatures: list[float] = []

    def _loops(self, page: PageRequest) -> bool:
        if self.match.search(page.request_id) is None:
            return False
        return self.mode == "always" or page.sampling.temperature == 0

    async def _work(self, page: PageRequest) -> Recognition:
        self.temperatures.append(page.sampling.temperature)
        await asyncio.sleep(self.delay)
        if not self._loops(page):
            return await _echo(page)
        raw = "# A page that loops\n\n" + LOOP_UNIT * self.repeats
        return Recognition(
            markdown=raw,
            raw=raw,
            blocks=[{"type": "text", "text": raw, "bbox": None}],
            prompt_tokens=1,
            completion_tokens=len(raw.split()),
            finish_reason=self.finish_reason,
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "match": self.match.pattern}
