"""Bounding and returning the daemon's memory: the C heap's free memory handed back to the system
(glibc's ``malloc_trim``), and the one budget that bounds how many full-size page images are decoded
at once.

Engines, the per-document session and the renderer all use them, so they sit at the bottom of the
layers.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator


def _find_malloc_trim() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_MALLOC_TRIM = _find_malloc_trim()

TRIM_INTERVAL_SECONDS = 10.0

TRIM_AFTER_BYTES = 64 * 1024 * 1024
"""A decode that held this much of a ``DecodeBudget`` is followed by a heap trim: glibc keeps a
freed page image in its arenas otherwise, and RSS stays at its peak with nothing in flight."""


def trim_heap() -> None:
    """glibc may keep freed memory in its arenas instead of returning it: without a trim the
    daemon's RSS climbs by gigabytes over a few hundred pages and stays there with nothing in
    flight."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class HeapTrimmer:
    """``trim_heap`` at most once per ``interval`` seconds, and never twice at once: malloc_trim
    walks every arena under its lock (tens of milliseconds with nothing to return, hundreds after a
    large free), so a wave of documents finishing together must not queue one trim each behind the
    event loop's allocations."""

    def __init__(
        self, interval: float = TRIM_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
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


class DecodeBudget:
    """Bytes of full-size page images that all render workers together may hold while a page is
    decoded and brought down to its page size. One per process, shared by every worker: a bound per
    worker multiplies by the number of workers, and one 160-megapixel image alone decodes to 635 MB.

    Requests are served in arrival order, so a large page is not passed over for ever by small ones;
    a request larger than the whole budget waits until nothing else is held and then runs alone. The
    counters are read by tests and benchmarks.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"a decode budget of {limit_bytes} bytes")
        self.limit = limit_bytes
        self.held = 0
        self.holders = 0
        self.peak = 0
        """The most bytes ever held at once (a request over the limit counts as the limit)."""
        self.peak_holders = 0
        self.granted = 0
        self.waits = 0
        """Requests that found the budget short, or others ahead of them, and waited."""
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Block until ``nbytes`` fit beside what others hold, and hold them while the block
        runs."""
        charge = max(0, min(nbytes, self.limit))
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                if not self._fits(ticket, charge):
                    self.waits += 1
                    self._cond.wait_for(lambda: self._fits(ticket, charge))
            # interrupted while waiting: never leave the ticket to block those behind it
            except BaseException:
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self.held += charge
            self.holders += 1
            self.granted += 1
            self.peak = max(self.peak, self.held)
            self.peak_holders = max(self.peak_holders, self.holders)
            self._cond.notify_all()  # the next in line may fit as well
        try:
            yield
        finally:
            # before the next one may start; the holder has dropped its image
            if nbytes >= TRIM_AFTER_BYTES:
                trim_heap()
            with self._cond:
                self.held -= charge
                self.holders -= 1
                self._cond.notify_all()

    def _fits(self, ticket: object, charge: int) -> bool:
        return self._queue[0] is ticket and self.held + charge <= self.limit


UNBOUNDED = DecodeBudget(2**62)
"""For callers outside the daemon (tools, tests): never waits, still trims after a large page."""


def image_bytes(mode: str, width: int, height: int) -> int:
    """What a Pillow image of this mode and size takes in memory: one byte a pixel for 8-bit
    single-band modes, two for 16-bit, four for the rest (RGB is stored as 32 bits)."""
    return width * height * (1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4)
