"""structlog set-up: JSON lines when not on a terminal (systemd, pipes), key=value on a terminal.

Under systemd, each line also carries its level as sd-daemon(3)'s ``<N>`` prefix, so journald
records the priority and ``journalctl -p err`` shows the failures alone; elsewhere the output is
left as it is. The lines the command line writes itself (a configuration error before logging is set
up, a progress line) go through ``say``, which prefixes them the same way; once the log lines are
JSON, ``say``'s are JSON events among them, so that stderr holds one format. While a live display
holds the terminal's last line (``ocr``'s bar), every line is written above it (``bar_shown``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from contextlib import AbstractContextManager
from typing import Any, TextIO

import structlog
from tqdm import tqdm

from ocrwatch.config import LogConfig

SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
"""structlog level → syslog priority, as journald reads it from the ``<N>`` prefix."""


def use_json(cfg: LogConfig, stream: TextIO) -> bool:
    if cfg.format == "auto":
        return not stream.isatty()
    return cfg.format == "json"


def writes_to_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the journal's own connection: ``JOURNAL_STREAM`` names its device and
    inode (systemd.exec(5)), and a stream that was redirected since (a pipe, a file) no longer
    matches them."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(stream.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    # no such descriptor, not a real file (io.UnsupportedOperation), malformed
    except (OSError, ValueError):
        return False


def prefixed(text: str, level: str) -> str:
    """``text`` with ``<N>`` before each of its lines: journald reads the prefix of each line
    apart."""
    prefix = f"<{SYSLOG_PRIORITY.get(level, 6)}>"
    return "\n".join(prefix + line for line in text.split("\n"))


_bar_shown = False
_json_stderr: object = None
"""The stderr whose log lines ``configure`` made JSON (None: they are not): ``say`` writes events
only there, so a later stderr (a test's own) is not taken for it."""


def bar_shown(shown: bool) -> None:
    """Whether a progress bar (tqdm's: ``ocr``'s) holds the last line of stderr now: while it does,
    each line is written above it."""
    global _bar_shown
    _bar_shown = shown


def _above_bar() -> AbstractContextManager[object]:
    """The bar cleared for one line and drawn again after it; nothing where none is shown."""
    return tqdm.external_write_mode(file=sys.stderr) if _bar_shown else contextlib.nullcontext()


def say(text: str, level: str = "error", event: str = "cli_message", **fields: Any) -> None:
    """Write ``text`` to stderr as the command line's own message at ``level``: where the log lines
    are JSON, as the event ``event`` with ``text`` as its ``message`` and ``fields``; else as it
    is, prefixed where stderr is the journal."""
    stream = sys.stderr
    if _json_stderr is not None and _json_stderr is stream:
        getattr(structlog.get_logger(), level)(event, message=text, **fields)
        return
    with _above_bar():
        print(prefixed(text, level) if writes_to_journal(stream) else text, file=stream, flush=True)


def _same_file(one: TextIO, other: TextIO) -> bool:
    """Whether two streams write to one descriptor (the logs' own wrapper of stderr, and stderr)."""
    try:
        return one is other or one.fileno() == other.fileno()
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return False


class _AboveBar:
    """The log lines' stream, each line written above the bar where one is shown (one write a
    line: structlog's ``WriteLogger``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock, _above_bar():
            return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()


class JournalPrefix:
    """Wraps the final renderer and puts ``<N>`` before every line it renders (a console traceback
    spans several, and journald reads the prefix of each)."""

    def __init__(self, renderer: structlog.typing.Processor) -> None:
        self._renderer = renderer

    def __call__(
        self, logger: Any, method_name: str, event_dict: structlog.typing.EventDict
    ) -> str:
        rendered = self._renderer(logger, method_name, event_dict)
        return prefixed(str(rendered), event_dict.get("level", method_name))


class _Forward(logging.Handler):
    """A library's record (stdlib logging: watchdog, botocore, aiohttp) as one of our lines, in the
    same format and with the same journald priority, instead of Python's bare last-resort line on
    stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname.lower()
        fields: dict[str, Any] = {"logger": record.name}
        if record.exc_info:
            fields["exc_info"] = record.exc_info
        log = structlog.get_logger()
        getattr(log, level if level in SYSLOG_PRIORITY else "error")(record.getMessage(), **fields)


def configure(cfg: LogConfig, stream: TextIO = sys.stderr) -> None:
    """Configure once at start-up; every module then logs through ``structlog.get_logger()``, and
    the libraries' stdlib records (warnings and worse, stdlib's default) are forwarded to it."""
    global _json_stderr
    level = getattr(logging, cfg.level.upper())
    as_json = use_json(cfg, stream)
    _json_stderr = sys.stderr if as_json and _same_file(stream, sys.stderr) else None
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(ensure_ascii=False)
        if as_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    if writes_to_journal(stream):
        renderer = JournalPrefix(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(_AboveBar(stream)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    if not any(isinstance(handler, _Forward) for handler in root.handlers):
        root.addHandler(_Forward())
