"""Engines and a daemon runner for the hardening and crash-safety tests.

- ``CountingEngine``: echoes every page quickly and appends one line per recognition to a file
  (``start``/``done``, the daemon's pid and the request id), so a test can count, across ``kill -9`` and
  restarts, how often each page of each document was recognised.
- ``GarbageEngine``: answers with hostile text (lone surrogates, NULs and control characters, bidi overrides,
  fake page markers, half layout tags, a megabyte of text, nothing at all): the sidecars must still be
  valid UTF-8 JSON and Markdown.

``PluginDaemon`` runs ``ocrwatch run`` as a real process with one of these (or ``tests.fault_engines``) as its
engine, through ``[engine] kind = "plugin"``: the daemon is the real one; only the engine differs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ocrwatch.engines.base import PageRequest, Recognition, RenderHint

REPO = Path(__file__).resolve().parent.parent


def job_id_of(path: Path) -> str:
    """The daemon's job id for a local file (``daemon.job_id``): the prefix of every request id of its pages."""
    return hashlib.sha1(path.resolve().as_uri().encode()).hexdigest()[:12]


def _echo(page: PageRequest, text: str | None = None) -> Recognition:
    width, height = page.image.size
    digest = hashlib.blake2b(page.image.tobytes(), digest_size=6).hexdigest()
    raw = text if text is not None else f"Echo of page {page.page_index + 1}, {width}x{height}, pixels {digest}."
    return Recognition(
        markdown=raw, raw=raw, blocks=[{"type": "text", "text": raw, "bbox": [0, 0, width, height]}],
        prompt_tokens=1, completion_tokens=len(raw.split()), finish_reason="stop",
    )  # fmt: skip


class _Base:
    name = "base"

    def __init__(self, *, max_concurrency: int = 4, dpi: int = 100) -> None:
        self.max_concurrency = max_concurrency
        self.render_hint = RenderHint(dpi=dpi)
        self._tasks: dict[str, asyncio.Task[Recognition]] = {}

    async def start(self) -> None:
        """Nothing to load."""

    async def recognize(self, page: PageRequest) -> Recognition:
        task = asyncio.ensure_future(self._work(page))
        self._tasks[page.request_id] = task
        try:
            return await task
        finally:
            self._tasks.pop(page.request_id, None)

    async def _work(self, page: PageRequest) -> Recognition:
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    def release(self) -> None:
        """Nothing cached."""

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


class CountingEngine(_Base):
    """Echoes each page after ``delay`` seconds and appends ``start``/``done PID REQUEST_ID`` lines to ``log``.

    Each line is one ``write`` on an ``O_APPEND`` descriptor, so lines from concurrent pages never interleave
    and a ``kill -9`` leaves every completed line whole.
    """

    name = "counting"

    def __init__(self, *, log: str, delay: float = 0.0, max_concurrency: int = 4, dpi: int = 100) -> None:
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


class GarbageEngine(_Base):
    """Answers page *n* with ``GARBAGE[n % len(GARBAGE)]``, with a block whose bbox is hostile too."""

    name = "garbage"

    async def _work(self, page: PageRequest) -> Recognition:
        text = GARBAGE[page.page_index % len(GARBAGE)]
        return Recognition(
            markdown=text, raw=text, blocks=[{"type": "text\x00", "text": text, "bbox": [-1, 0, 10**12, 2]}],
            prompt_tokens=None, completion_tokens=None, finish_reason="stop",
        )  # fmt: skip


# --- running the real daemon with a test engine ---------------------------------------------------------


def engine_settings(spec: str, args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``[engine]`` overrides and extra environment that make the daemon run ``spec`` built with ``args``."""
    return {"kind": "plugin", "plugin": spec, "plugin_args": args}, {}


@functools.cache
def _make_plugin_daemon_class() -> Any:
    from tests.integration.conftest import DaemonProcess, wait_until

    class PluginDaemon(DaemonProcess):
        """``DaemonProcess`` whose engine is a test engine (see the module docstring)."""

        def __init__(
            self, root: Path, spec: str, engine_args: dict[str, Any] | None = None,
            inboxes: list[dict[str, Any]] | None = None, **overrides: Any,
        ) -> None:  # fmt: skip
            settings, self.engine_env = engine_settings(spec, engine_args or {})
            overrides["engine"] = {**settings, **overrides.get("engine", {})}
            super().__init__(root, inboxes, **overrides)

        def start(self, env: dict[str, str] | None = None, wait_ready: bool = True) -> PluginDaemon:
            self.log_path = self.root / f"daemon-{time.time_ns()}.log"
            self._log_handle = open(self.log_path, "wb")
            pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ocrwatch", "run", "--config", str(self.config_path)], stdout=self._log_handle, stderr=subprocess.STDOUT, cwd=self.root,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **self.engine_env, **(env or {})},
            )  # fmt: skip
            if wait_ready:
                wait_until(self.ready, 60, f"daemon ready (log {self.log_path}):\n{self.log_text()}")
            return self

        def all_events(self) -> list[dict[str, Any]]:
            """Events of every run of this daemon (each start writes a new log), oldest run first."""
            out = []
            for log in sorted(self.root.glob("daemon-*.log")):
                for line in log.read_text(errors="replace").splitlines():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
            return out

    return PluginDaemon


def __getattr__(name: str) -> Any:
    if name == "PluginDaemon":  # built lazily: the integration conftest imports pytest
        return _make_plugin_daemon_class()
    raise AttributeError(name)
