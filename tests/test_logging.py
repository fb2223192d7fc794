"""Log lines under systemd carry sd-daemon(3)'s ``<N>`` priority prefix, read from real processes'
output.

journald stores the prefix as the line's priority, so ``journalctl -u ocrwatch -p err`` shows what
was logged at error level and nothing else. The process learns it writes to the journal from
``JOURNAL_STREAM`` (device:inode of its stream); the tests set it to the pipe or file the process
really writes to.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from ocrwatch.config import InboxConfig, LogConfig
from ocrwatch.infra.logging import configure, writes_to_journal
from tests.integration.conftest import DaemonProcess, wait_until
from tests.support import docs

PREFIXED = re.compile(r"^<([0-7])>(.*)$")
PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def journal_stream(fd: int) -> str:
    """What systemd would put in ``JOURNAL_STREAM`` for this descriptor."""
    stat = os.fstat(fd)
    return f"{stat.st_dev}:{stat.st_ino}"


def run_ocr(files: list[Path], journal: str | None) -> str:
    """``ocrwatch ocr`` as a process writing to a pipe, with ``JOURNAL_STREAM`` as given
    (``"pipe"``: the pipe's own device:inode); its stdout and stderr together."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    if journal is not None:
        env["JOURNAL_STREAM"] = journal_stream(write_end) if journal == "pipe" else journal
    proc = subprocess.Popen(
        [sys.executable, "-m", "ocrwatch", "ocr", "--engine", "tesseract", *map(str, files)],
        stdout=write_end,
        stderr=write_end,
        env=env,
        cwd=files[0].parent,
    )
    os.close(write_end)
    with os.fdopen(read_end, errors="replace") as pipe:
        output = pipe.read()
    assert proc.wait(120) == 1, output  # one file fails
    return output


def records(output: str) -> list[tuple[int, dict[str, Any]]]:
    """(priority, event) of every prefixed line whose payload is a JSON event."""
    found = []
    for line in output.splitlines():
        match = PREFIXED.match(line)
        if match and match.group(2).startswith("{"):
            found.append((int(match.group(1)), json.loads(match.group(2))))
    return found


@pytest.mark.integration
def test_ocr_under_journal_prefixes_each_event_with_its_priority(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"not a document at all")
    good = docs.write_png(tmp_path / "good.png", ["Journal page"])
    output = run_ocr([bad, good], "pipe")
    # no event unprefixed
    assert not [line for line in output.splitlines() if line.startswith("{")], output
    events = records(output)
    assert events and all(priority == PRIORITY[event["level"]] for priority, event in events), (
        output
    )
    failed = [event for priority, event in events if priority <= 3]
    assert sorted((e["event"], e["kind"]) for e in failed) == [
        ("job_failed", "not_a_document"),
        ("ocr_failed", "not_a_document"),  # the CLI's own line for the failed file: an event too
    ], output
    assert any(event["event"] == "job_done" for _, event in events)
    said = [line for line in output.splitlines() if not re.sub(r"^<\d>", "", line).startswith("{")]
    summary = "1 done, 0 skipped, 1 failed"  # on stdout, which the user reads: never prefixed
    assert said == [summary], output
    [error] = [event for event in failed if event["event"] == "ocr_failed"]
    assert error["message"].startswith("ocrwatch: bad.pdf: not_a_document: "), output


@pytest.mark.integration
@pytest.mark.parametrize("journal", [None, "elsewhere", "garbage"])
def test_output_is_unchanged_when_not_writing_to_the_journal(
    tmp_path: Path, journal: str | None
) -> None:
    if journal == "elsewhere":  # systemd set it, but the process's output was redirected since
        journal = f"{tmp_path.stat().st_dev}:{tmp_path.stat().st_ino}"
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"not a document at all")
    output = run_ocr([bad], journal)
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert not re.search(r"^<\d>", output, re.M), output
    assert any(event["event"] == "job_failed" and event["level"] == "error" for event in events)


@pytest.mark.integration
def test_daemon_under_journal_err_priority_holds_the_failed_jobs_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Every line the daemon writes, start to stop, carries a prefix; ``-p err`` would show only
    job_failed."""
    daemon = DaemonProcess(tmp_path)  # its config: Tesseract, debug level, JSON
    bad = daemon.inbox / "broken.pdf"
    good_path = daemon.inbox / "fine.png"
    daemon.log_path = tmp_path / "journal.log"
    with open(daemon.log_path, "wb") as log:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "JOURNAL_STREAM": journal_stream(log.fileno()),
        }
        daemon.proc = subprocess.Popen(
            [sys.executable, "-m", "ocrwatch", "run", "--config", str(daemon.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
        )
        try:
            wait_until(daemon.ready, 60, "daemon ready")
            docs.write_corrupt_pdf(bad)
            docs.write_png(good_path, ["Fine page"])
            wait_until(
                lambda: (
                    {"job_failed", "job_done"}
                    <= {e["event"] for _, e in records(daemon.log_text())}
                ),
                90,
                "both jobs finished",
            )
            daemon.proc.send_signal(signal.SIGTERM)
            assert daemon.proc.wait(60) == 0
        finally:
            if daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait(10)
    lines = daemon.log_text().splitlines()
    assert lines and all(PREFIXED.match(line) for line in lines), daemon.log_text()
    events = records(daemon.log_text())
    assert len(events) == len(lines)
    assert all(priority == PRIORITY[event["level"]] for priority, event in events)
    errors = [event for priority, event in events if priority <= 3]
    assert [(e["event"], e["uri"]) for e in errors] == [("job_failed", bad.as_uri())], errors
    # debug and info lines were written and kept apart
    assert {7, 6} <= {priority for priority, _ in events}


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    handlers = list(logging.getLogger().handlers)
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers


def test_a_librarys_stdlib_records_become_lines_like_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_structlog: None
) -> None:
    """watchdog, botocore and aiohttp log through the standard library: their warnings become JSON
    lines with their priority, not bare text."""
    with open(tmp_path / "journal", "w") as stream:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream(stream.fileno()))
        configure(LogConfig(level="debug", format="json"), stream)
        logging.getLogger("some.library").warning("disk %s", "slow")
        logging.getLogger("some.library").info(
            "below the standard library's default level: never made"
        )
    lines = (tmp_path / "journal").read_text().splitlines()
    got = [(int(m.group(1)), json.loads(m.group(2))) for m in map(PREFIXED.match, lines) if m]
    assert len(got) == len(lines) == 1, lines
    assert [(p, e["event"], e["level"], e["logger"]) for p, e in got] == [
        (4, "disk slow", "warning", "some.library")
    ]


def test_every_level_maps_to_its_syslog_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_structlog: None
) -> None:
    with open(tmp_path / "journal", "w") as stream:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream(stream.fileno()))
        configure(LogConfig(level="debug", format="json"), stream)
        log = structlog.get_logger()
        (
            log.debug("d"),
            log.info("i"),
            log.warning("w"),
            log.warn("w2"),
            log.error("e"),
            log.critical("c"),
        )
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("x")
    got = [
        (int(m.group(1)), json.loads(m.group(2))["event"])
        for m in map(PREFIXED.match, (tmp_path / "journal").read_text().splitlines())
        if m
    ]
    assert got == [(7, "d"), (6, "i"), (4, "w"), (4, "w2"), (3, "e"), (2, "c"), (3, "x")]


def test_a_console_traceback_gets_the_prefix_on_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_structlog: None
) -> None:
    with open(tmp_path / "journal", "w") as stream:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream(stream.fileno()))
        configure(LogConfig(format="console"), stream)
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger().exception("it_failed")
    lines = (tmp_path / "journal").read_text().splitlines()
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines), lines
    assert any("ValueError" in line for line in lines)


def test_writes_to_journal_only_for_the_named_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "a", "w") as a, open(tmp_path / "b", "w") as b:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        assert not writes_to_journal(a)
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream(a.fileno()))
        assert writes_to_journal(a) and not writes_to_journal(b)
        for malformed in ("", "12", "x:y", "1:2:3"):
            monkeypatch.setenv("JOURNAL_STREAM", malformed)
            assert not writes_to_journal(a)
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    # no descriptor at all (pytest's capture, a test's buffer)
    assert not writes_to_journal(io.StringIO())


def run_cli(tmp_path: Path, *args: str, journal: bool) -> tuple[int, list[str], str]:
    """``ocrwatch ARGS`` as a process whose stderr is a file, named by ``JOURNAL_STREAM`` when
    ``journal``: its exit status, its stderr's lines and its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with open(tmp_path / "stderr", "w") as stream:
        if journal:
            env["JOURNAL_STREAM"] = journal_stream(stream.fileno())
        proc = subprocess.run(
            [sys.executable, "-m", "ocrwatch", *args],
            stderr=stream,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    return proc.returncode, (tmp_path / "stderr").read_text().splitlines(), proc.stdout


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "terminal-or-pipe"])
def test_the_command_lines_own_lines_carry_their_priority_under_journal(
    tmp_path: Path, journal: bool
) -> None:
    """What the command line writes itself, before logging is set up or beside it, is prefixed
    too."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nreconcile_seconds = -1\n")
    status, lines, _ = run_cli(tmp_path, "run", "--config", str(bad), journal=journal)
    assert status == 2 and len(lines) >= 2, lines
    assert lines[0] == ("<3>" if journal else "") + "ocrwatch: invalid configuration:"
    assert all(line.startswith("<3>") == journal for line in lines), lines  # the error's every line
    assert any("reconcile_seconds" in line for line in lines)

    good = tmp_path / "good.toml"
    good.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    (tmp_path / "empty").mkdir()
    status, lines, stdout = run_cli(
        tmp_path, "ocr", "--config", str(good), str(tmp_path / "empty"), journal=journal
    )
    # stdout: for the user, never prefixed
    assert status == 0 and stdout == "0 done, 0 skipped, 0 failed\n"
    # beside the log lines, JSON as they are off a terminal
    [line] = lines
    assert line.startswith("<4>{" if journal else "{"), lines
    said = json.loads(line.removeprefix("<4>"))
    assert (said["event"], said["level"]) == ("cli_message", "warning")
    assert said["message"] == (
        f"ocrwatch: {tmp_path / 'empty'}: no documents matching "
        + " ".join(InboxConfig.model_fields["patterns"].default)
    )
    assert not (tmp_path / "state").exists()  # nothing to do: no state_dir made
