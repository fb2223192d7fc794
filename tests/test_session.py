"""DocumentSession's clean-up: the private folder goes, the engine is asked to release, and the C heap's
free memory goes back to the system."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocrwatch import session
from ocrwatch.session import DocumentSession, HeapTrimmer, trim_heap


class ReleasingEngine:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1

    async def abort(self, request_id: str) -> None:
        raise AssertionError("no document was scheduled")


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_every_way_out_removes_the_spool_folder_and_releases(tmp_path: Path) -> None:
    engine = ReleasingEngine()
    with pytest.raises(RuntimeError):
        async with DocumentSession("job-1", tmp_path, engine) as s:  # type: ignore[arg-type]
            spool = s.spool_dir
            assert spool is not None and spool.is_dir()
            (spool / "page.png").write_bytes(b"x")
            raise RuntimeError("the document failed")
    assert not spool.exists()
    assert engine.released == 1


@pytest.mark.skipif(session._MALLOC_TRIM is None, reason="not glibc: malloc_trim is absent")
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
    monkeypatch.setattr(session, "trim_heap", lambda: trims.append(now[0]))
    trimmer = HeapTrimmer(interval=10.0, clock=lambda: now[0])
    assert trimmer() is True
    now[0] = 109.9
    assert trimmer() is False
    now[0] = 110.0
    assert trimmer() is True
    assert trims == [100.0, 110.0]
