"""Every command into a closed pipe (``ocrwatch status | head``): it stops quietly with 141
(128 + SIGPIPE), never with a ``BrokenPipeError`` traceback or Python's "Exception ignored" at exit.
Real pipes between real processes: ``head`` reading one byte of an output larger than a pipe holds,
or a pipe whose reader closed before the command started."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.store.ledger import Fingerprint, Ledger
from tests.support import docs

CLOSED_PIPE = 141
INBOXES = 2000  # a "queue: <inbox>: 1 waiting" line each: status prints more than 64 KiB
SHUTDOWN_TIMEOUT = 10.0


def ocrwatch(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "ocrwatch", *map(str, args)]


def admit(ledger: Ledger, path: Path, digit: str = "0") -> None:
    job = Job(origin=LocalFile(path, path.parent), source="local")
    ledger.admit(job, Fingerprint(1, 1, digit * 64))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A configuration whose ledger holds a queued job in each of ``INBOXES`` inboxes, and a failed
    one (for ``retry``)."""
    state = tmp_path / "state"
    with Ledger(state / "ledger.sqlite3") as ledger:
        for index in range(INBOXES):
            admit(ledger, tmp_path / f"inbox-{index:05d}" / "a.pdf")
        failed = tmp_path / "inbox-00000" / "bad.pdf"
        admit(ledger, failed, "1")
        error = {"kind": "corrupt_pdf", "message": "xref broken", "retryable": False}
        ledger.mark_failed(failed.as_uri(), error)
    path = tmp_path / "ocrwatch.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "state_dir": str(state),
                "inbox": [{"path": str(tmp_path / "inbox")}],
                "engine": {"kind": "tesseract"},
                "metrics": {"enabled": False},
            }
        )
    )
    return path


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader is already gone: every write to it is refused."""
    reader, writer = os.pipe()
    os.close(reader)
    yield writer
    os.close(writer)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_status_into_head_ends_quietly_with_141(config: Path, json_flag: list[str]) -> None:
    """``ocrwatch status | head -c 1`` on a real ledger whose status overflows the pipe."""
    command = ocrwatch("status", *json_flag, "--config", config)
    status = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-c", "1"], stdin=status.stdout, stdout=subprocess.PIPE)
    assert status.stdout is not None and status.stderr is not None
    status.stdout.close()  # head alone reads it now, as in a shell's pipeline
    first, _ = head.communicate(timeout=60)
    stderr = status.stderr.read().decode()
    assert status.wait(timeout=60) == CLOSED_PIPE, stderr
    assert first == (b"{" if json_flag else b"d") and head.returncode == 0
    assert stderr == ""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["status"], ["status", "--json"], ["retry"], ["check"]],
    ids=["help", "status", "status-json", "retry", "check"],
)
def test_each_command_into_a_closed_pipe_ends_quietly_with_141(
    config: Path, closed_pipe: int, args: list[str]
) -> None:
    command = ocrwatch(*args) if args == ["--help"] else ocrwatch(*args, "--config", config)
    done = subprocess.run(
        command, stdout=closed_pipe, stderr=subprocess.PIPE, text=True, timeout=120
    )
    assert done.returncode == CLOSED_PIPE and done.stderr == "", done.stderr


def test_ocr_into_a_closed_pipe_ends_quietly_with_141(
    config: Path, closed_pipe: int, tmp_path: Path
) -> None:
    """stdout closed: the summary is refused once the documents are done, their sidecars written."""
    png = docs.write_png(tmp_path / "note.png", ["Delivery note seven"])
    done = subprocess.run(
        ocrwatch("ocr", "--config", config, png),
        stdout=closed_pipe,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert done.returncode == CLOSED_PIPE and "Traceback" not in done.stderr, done.stderr
    assert "Delivery" in png.with_name("note.png.md").read_text()


def test_ocr_with_its_log_into_a_closed_pipe_stops_with_141(
    config: Path, closed_pipe: int, tmp_path: Path
) -> None:
    """stderr closed: the first log or progress line is refused and the run stops as on Ctrl-C, its
    document interrupted (no error sidecar for it), not failed."""
    pdf = docs.write_pdf(tmp_path / "long.pdf", [[f"Page {n}"] for n in range(1, 9)])
    done = subprocess.run(
        ocrwatch("ocr", "--config", config, pdf),
        stdout=subprocess.PIPE,
        stderr=closed_pipe,
        text=True,
        timeout=300,
    )
    assert done.returncode == CLOSED_PIPE, done.stdout
    assert not pdf.with_name("long.pdf.error.json").exists()


def test_run_with_its_log_into_a_closed_pipe_drains_and_stops_with_141(
    tmp_path: Path, closed_pipe: int
) -> None:
    """The daemon's log refused: it stops as on SIGTERM (drained, within shutdown_timeout), exit
    141, so a unit's ``Restart=on-failure`` starts it again with a new stream."""
    config = tmp_path / "ocrwatch.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "state_dir": str(tmp_path / "state"),
                "inbox": [{"path": str(tmp_path / "inbox"), "settle_seconds": 0.3}],
                "engine": {"kind": "tesseract"},
                "metrics": {"enabled": False},
                "daemon": {"shutdown_timeout": SHUTDOWN_TIMEOUT},
                "log": {"format": "json"},
            }
        )
    )
    command = ocrwatch("run", "--config", config)
    daemon = subprocess.Popen(command, stdout=closed_pipe, stderr=closed_pipe)
    try:
        assert daemon.wait(timeout=60 + SHUTDOWN_TIMEOUT + 5) == CLOSED_PIPE
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert (tmp_path / "state" / "ledger.sqlite3").exists()  # it had started: the stop was its own
