"""Handing the C heap's free memory back to the system (glibc's ``malloc_trim``).

Engines and the per-document session both call it, so it sits at the bottom of the layers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable


def _find_malloc_trim() -> ctypes._CFuncPtr | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_MALLOC_TRIM = _find_malloc_trim()

TRIM_INTERVAL_SECONDS = 10.0


def trim_heap() -> None:
    """glibc may keep freed memory in its arenas instead of returning it: without a trim the daemon's RSS
    climbs by gigabytes over a few hundred pages and stays there with nothing in flight."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class HeapTrimmer:
    """``trim_heap`` at most once per ``interval`` seconds, and never twice at once: malloc_trim walks every
    arena under its lock (tens of milliseconds with nothing to return, hundreds after a large free), so a wave
    of documents finishing together must not queue one trim each behind the event loop's allocations."""

    def __init__(self, interval: float = TRIM_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last = -float("inf")
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        """Trim if the last trim is ``interval`` old; whether this call trimmed."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            now = self._clock()
            if now - self._last < self.interval:
                return False
            self._last = now
            trim_heap()
            return True
        finally:
            self._lock.release()
