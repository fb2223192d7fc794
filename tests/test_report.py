"""What ``ocrwatch ocr`` prints: on a terminal one bar for the run, with pages, pages a second and
the time left (the real command under a pseudo-terminal), elsewhere one line per page step."""

from __future__ import annotations

import fcntl
import json
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
import structlog

from ocrwatch.app.report import OcrReport
from ocrwatch.config import LogConfig
from ocrwatch.infra.logging import configure, say
from tests.support import docs


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


def test_a_line_written_while_the_bar_is_shown_gets_a_line_of_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A log line (``engine_selected`` at warning level was one) and the command's own line are
    written above the bar, never after it on its line."""
    configure(LogConfig(format="console"), sys.stderr)
    try:
        report = OcrReport(1, bar=True)
        report.show({"event": "progress", "file": "a.pdf", "pages_done": 1, "pages_total": 2})
        structlog.get_logger().warning("engine_warned", engine="tesseract")
        say("ocrwatch: handed 1 file(s) to the running daemon", "info")
        report.show({"event": "result", "file": "a.pdf", "status": "ok"})
        report.finish()
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    shown = re.split(r"[\r\n]", err)
    [logged] = [line for line in shown if "engine_warned" in line]
    assert re.match(r"\d{4}-\d\d-\d\dT", logged), err  # its timestamp first: nothing before it
    [said] = [line for line in shown if "handed 1 file(s)" in line]
    assert said.startswith("ocrwatch: "), err


@pytest.mark.slow
def test_off_a_terminal_stderr_holds_json_events_only(tmp_path: Path) -> None:
    """The log lines are JSON there, and so are the command's own: each page step
    (``ocr_progress``) and each failure (``ocr_failed``); the summary is stdout's."""
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"not a document at all")
    good = docs.write_png(tmp_path / "good.png", ["Piped page"])
    proc = subprocess.run(
        [sys.executable, "-m", "ocrwatch", "ocr", "--engine", "tesseract", str(bad), str(good)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == "1 done, 0 skipped, 1 failed\n", proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines()]  # each line one event
    [failed] = [event for event in events if event["event"] == "ocr_failed"]
    assert (failed["file"], failed["kind"], failed["level"]) == (
        "bad.pdf",
        "not_a_document",
        "error",
    )
    assert failed["hint"] and failed["message"].startswith("ocrwatch: bad.pdf: not_a_document: ")
    steps = [event for event in events if event["event"] == "ocr_progress"]
    assert {"file": "good.png", "pages_done": 1, "pages_total": 1}.items() <= steps[-1].items()


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
