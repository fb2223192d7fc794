"""The C heap's free memory goes back to the system, and a wave of callers trims it only once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocrwatch import memory
from ocrwatch.memory import HeapTrimmer, trim_heap


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(memory._MALLOC_TRIM is None, reason="not glibc: malloc_trim is absent")
def test_trim_heap_returns_the_holes_freed_buffers_leave() -> None:
    """Every other 64 KiB buffer freed: below glibc's mmap threshold, so the holes stay in the heap (and in
    RSS) until malloc_trim releases them."""
    trim_heap()
    kept, freed = [], []
    for i in range(4000):
        (kept if i % 2 else freed).append(bytearray(b"\x01" * 65536))
    del freed
    before = rss_bytes()
    trim_heap()
    after = rss_bytes()
    assert before - after > 64 * 2**20, (before, after)
    assert len(kept) == 2000


def test_the_heap_is_trimmed_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[float] = []
    now = [100.0]
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(now[0]))
    trimmer = HeapTrimmer(interval=10.0, clock=lambda: now[0])
    assert trimmer() is True
    now[0] = 109.9
    assert trimmer() is False
    now[0] = 110.0
    assert trimmer() is True
    assert trims == [100.0, 110.0]
