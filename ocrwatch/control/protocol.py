"""The control channel's wire: where the socket and the lock live, what a request looks like, and
the error either end raises. Client and server both import it; it imports neither.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from ocrwatch.config import TextMode
from ocrwatch.errors import TransientError

SOCKET_NAME = "control.sock"
LOCK_NAME = "daemon.lock"
SUN_PATH_MAX = 108
"""Bytes in ``sockaddr_un.sun_path``, its final NUL included."""
REQUEST_LIMIT = 64 * 1024 * 1024
"""The longest request line: an ``ocr DIR`` request names every file found."""
CONNECT_SECONDS = 5.0
"""How long a client waits for a daemon that holds the lock to answer (it binds the socket right
after locking)."""
REQUEST_PREFIX = "cli:"
"""Source names of ``ocr`` requests: one source per request, so each has its own output folder."""

Emit = Callable[[dict[str, Any]], Awaitable[None]]


class ControlError(TransientError):
    """The daemon holding the state did not answer, or refused a request."""

    kind = "control_error"
    hint = "look at the daemon's log (journalctl -u ocrwatch), then try again"


@dataclass(frozen=True)
class OcrRequest:
    """Files to OCR, each with the folder it was found under (mirrored below ``out``), and how."""

    files: list[tuple[Path, Path]]
    out: Path | None = None
    force: bool = False
    engine: str | None = None  # the engine the user asked for; None: whichever runs
    lang: str | None = None  # Tesseract's language, when the user asked for one
    text: TextMode | None = None  # ``--text``: where the pages' text comes from; None: the inbox's

    def as_json(self) -> dict[str, Any]:
        return {
            "op": "ocr",
            "files": [[str(path), str(root)] for path, root in self.files],
            "out": None if self.out is None else str(self.out),
            "force": self.force,
            "engine": self.engine,
            "lang": self.lang,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OcrRequest:
        """The request a client sent; ValueError for one that does not have this shape."""
        files = data.get("files")
        if not isinstance(files, list) or not all(
            isinstance(f, list) and len(f) == 2 for f in files
        ):
            raise ValueError("files: a list of [path, root] pairs")
        out, engine, lang = data.get("out"), data.get("engine"), data.get("lang")
        if not all(value is None or isinstance(value, str) for value in (out, engine, lang)):
            raise ValueError("out, engine and lang: strings or null")
        if (text := data.get("text")) not in (None, *get_args(TextMode)):
            raise ValueError(f"text: one of {', '.join(get_args(TextMode))} or null")
        return cls(
            [(Path(str(path)), Path(str(root))) for path, root in files],
            None if out is None else Path(out),
            bool(data.get("force")),
            engine,
            lang,
            text,
        )


@contextlib.contextmanager
def address(path: Path) -> Iterator[str]:
    """``path`` as an AF_UNIX address. ``sun_path`` holds 107 bytes; a deeper state_dir is reached
    through a descriptor of its folder (``/proc/self/fd/N/control.sock``), which Linux resolves like
    any other path."""
    if len(os.fsencode(path)) < SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
