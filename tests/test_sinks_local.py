"""Sidecars beside the source: names, atomicity, stale error removal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocrwatch.naming import sidecar_names
from ocrwatch.sinks import local as local_sink
from ocrwatch.sinks.local import LocalSink, atomic_write
from ocrwatch.sources.base import Job, LocalFile


def job_for(path: Path) -> Job:
    return Job(origin=LocalFile(path, path.parent), source="local")


def test_names_keep_report_pdf_and_report_png_apart() -> None:
    assert sidecar_names("report.pdf", "{name}") == {
        "md": "report.pdf.md", "json": "report.pdf.json", "error": "report.pdf.error.json",
    }
    assert sidecar_names("report.png", "{name}")["md"] == "report.png.md"
    assert sidecar_names("report.pdf", "{stem}")["json"] == "report.json"


def test_write_then_error_then_success_removes_error(tmp_path: Path) -> None:
    source = tmp_path / "a b é.pdf"
    source.write_bytes(b"%PDF-1.4")
    sink = LocalSink()
    job = job_for(source)
    sink.write_error(job, {"status": "failed"})
    assert (tmp_path / "a b é.pdf.error.json").exists()
    sink.write(job, "# hello\n", {"source": {"sha256": "0" * 64}})
    assert (tmp_path / "a b é.pdf.md").read_text() == "# hello\n"
    assert sink.recorded(job) == {"sha256": "0" * 64}
    assert not (tmp_path / "a b é.pdf.error.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b é.pdf", "a b é.pdf.json", "a b é.pdf.md"]


def test_out_dir_mirrors_inbox_layout(tmp_path: Path) -> None:
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    (inbox / "sub").mkdir(parents=True)
    source = inbox / "sub" / "x.png"
    source.write_bytes(b"x")
    LocalSink(out_dir=out).write(Job(origin=LocalFile(source, inbox), source="local"), "m", {"source": {}})
    assert (out / "sub" / "x.png.json").exists()
    assert not (inbox / "sub" / "x.png.json").exists()


def test_atomic_write_failing_midway_leaves_old_content_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "doc.pdf.json"
    target.write_text("old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_sink.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        atomic_write(target, b"new content that never lands")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.pdf.json"]


def test_atomic_write_killed_midway_never_shows_a_torn_file(tmp_path: Path) -> None:
    """A writer process killed with SIGKILL at random moments: the final name holds old or new, whole."""
    import signal
    import subprocess
    import sys
    import time

    target = tmp_path / "big.json"
    old = json.dumps({"v": "old", "pad": "x" * 2_000_000})
    target.write_text(old)
    script = (
        "import json,sys; from pathlib import Path; from ocrwatch.sinks.local import atomic_write\n"
        "p=Path(sys.argv[1])\n"
        "for i in range(1000): atomic_write(p, json.dumps({'v': i, 'pad': 'y'*2_000_000}).encode())\n"
    )
    for delay in (0.05, 0.1, 0.17, 0.23, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", script, str(target)])
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = json.loads(target.read_text())
        assert set(data) == {"v", "pad"} and len(data["pad"]) == 2_000_000
    leftovers = [p for p in tmp_path.iterdir() if p.name != "big.json"]
    for leftover in leftovers:
        assert local_sink.TMP_MARKER in leftover.name and leftover.name.startswith(".")


def test_unwritable_folder_is_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only folders; covered by the read-only mount test")
    source = tmp_path / "ro" / "x.pdf"
    source.parent.mkdir()
    source.write_bytes(b"%PDF")
    source.parent.chmod(0o555)
    try:
        from ocrwatch.errors import OutputNotWritable

        with pytest.raises(OutputNotWritable):
            LocalSink().write(job_for(source), "m", {})
    finally:
        source.parent.chmod(0o755)
