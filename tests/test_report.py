"""What ``ocrwatch ocr`` prints: on a terminal one bar for the run, with pages, pages a second and
the time left (the real command under a pseudo-terminal), elsewhere one line per page step."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from ocrwatch.app.report import OcrReport
from tests import docs


def test_the_bar_counts_the_pages_of_every_file_as_their_totals_become_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = OcrReport(2, bar=True)
    report.show({"event": "progress", "file": "a.pdf", "pages_done": 1, "pages_total": 3})
    report.show({"event": "progress", "file": "b.png", "pages_done": 0, "pages_total": 1})
    report.show({"event": "progress", "file": "a.pdf", "pages_done": 3, "pages_total": 3})
    report.show({"event": "result", "file": "a.pdf", "status": "ok"})
    report.show({"event": "progress", "file": "b.png", "pages_done": 1, "pages_total": 1})
    error = {"kind": "corrupt_pdf", "message": "broken", "hint": "re-export it"}
    report.show({"event": "result", "file": "b.png", "status": "failed", "error": error})
    assert report._bar is not None and (report._bar.n, report._bar.total) == (4, 4)
    assert report.finish() is True
    captured = capsys.readouterr()
    assert "2/2 files" in captured.err and "4/4" in captured.err
    assert "b.png: corrupt_pdf: broken (hint: re-export it)" in captured.err
    assert captured.out == "1 done, 0 skipped, 1 failed\n"


def test_off_a_terminal_each_page_step_is_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    report = OcrReport(1, bar=False)
    report.show({"event": "progress", "file": "a.pdf", "pages_done": 1, "pages_total": 2})
    report.show({"event": "result", "file": "a.pdf", "status": "ok"})
    assert report.finish() is False
    assert capsys.readouterr().err == "ocrwatch: a.pdf: 1/2 pages\n"


@pytest.mark.slow
def test_ocr_on_a_terminal_draws_one_bar_with_the_rate_and_the_time_left(tmp_path: Path) -> None:
    pdf = docs.write_pdf(
        tmp_path / "three.pdf", [["Page one"], ["Page two"], ["Page three"]], dpi=72
    )
    config = tmp_path / "ocrwatch.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[engine]\nkind = "tesseract"\n')
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    command = [sys.executable, "-m", "ocrwatch", "ocr", "--config", str(config), str(pdf)]
    proc = subprocess.Popen(
        command,
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(follower)
    shown = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the command closed its end
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(30) == 0
    assert proc.stdout is not None and proc.stdout.read() == b"1 done, 0 skipped, 0 failed\n"
    text = shown.decode(errors="replace")
    # the rate as tqdm says it: pages a second, or seconds a page when slower than one a second
    assert re.search(r"1/1 files.*3/3 \[\d\d:\d\d<00:00, +[0-9.]+(page/s|s/page)\]", text), text
    assert "ocrwatch: three.pdf:" not in text and "job_done" not in text  # the bar instead
