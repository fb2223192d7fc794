"""DocumentSession's clean-up: the private folder goes and the engine is asked to release."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocrwatch.jobs.session import DocumentSession


class ReleasingEngine:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1

    async def abort(self, request_id: str) -> None:
        raise AssertionError("no document was scheduled")


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
