"""Hostile things at sidecar names, and faults of the place, against ``ocrwatch run`` with Tesseract
(issue 18).

A FIFO, a link to /dev/zero, a folder or a user's file where a sidecar goes ends its document in
``output_conflict``; a full disk, a read-only output folder or a read-only ``state_dir/tmp`` is
waited out, without using up the document's attempts, and the document ends ``ok`` once the place is
fixed, without a restart. Every test also shows that the daemon stays ready and stops on SIGTERM in
time.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ocrwatch.results.assemble import ERROR_SCHEMA
from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

SHUTDOWN_TIMEOUT = 10.0
USER_JSON = '{"note": "my own file, not ocrwatch\'s"}\n'


def lines(tag: str) -> list[str]:
    return [f"Document {tag}", "Quarterly report invoice"]


def remount(point: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(point)], check=True)


def events(daemon: DaemonProcess, event: str, path: Path | None = None) -> list[dict[str, Any]]:
    uri = path.resolve().as_uri() if path is not None else None
    return [
        e
        for e in daemon.events()
        if e.get("event") == event and (uri is None or e.get("uri") == uri)
    ]


def ledger_row(daemon: DaemonProcess, path: Path) -> dict[str, Any]:
    with contextlib.closing(
        sqlite3.connect(f"file:{daemon.state / 'ledger.sqlite3'}?mode=ro", uri=True, timeout=10)
    ) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT state, attempts, last_error FROM jobs WHERE key LIKE ?", (f"%{path.name}",)
        ).fetchone()
    assert row is not None, f"no ledger row for {path}"
    return {
        "state": row["state"],
        "attempts": row["attempts"],
        "error": json.loads(row["last_error"] or "null"),
    }


def carries_on(daemon: DaemonProcess, folder: Path, tag: str) -> float:
    """A normal file dropped now gets its sidecars; returns how long it took (the target is 10
    s)."""
    assert daemon.ready()
    started = time.monotonic()
    normal = docs.write_png(folder / f"normal {tag}.png", lines(tag))
    wait_until(
        lambda: sidecars_done(normal),
        60,
        f"sidecars of a normal file dropped afterwards ({normal.name})",
    )
    seconds = time.monotonic() - started
    assert sidecars_done(normal)["status"] == "ok"
    print(f"{tag}: a normal file dropped afterwards had its sidecars after {seconds:.1f}s")
    return seconds


def stops_in_time(daemon: DaemonProcess) -> None:
    """SIGTERM: exit 0 within shutdown_timeout + 5 s."""
    started = time.monotonic()
    assert daemon.stop(timeout=SHUTDOWN_TIMEOUT + 5) == 0
    print(f"SIGTERM to exit: {time.monotonic() - started:.1f}s")


def fill(folder: Path) -> Path:
    """Fill ``folder``'s filesystem to the last byte; returns the filler to delete."""
    filler = folder / ".filler"
    with contextlib.suppress(OSError), open(filler, "wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()
    return filler


# --- things at sidecar names ----------------------------------------------------------------------


def test_fifos_a_dev_zero_link_folders_and_a_users_file_at_sidecar_names(make_daemon) -> None:
    """Seven FIFOs named NAME.json (more than the worker threads), NAME.json linked to /dev/zero,
    folders named NAME.json and NAME.md, a user's NAME.json: each document ends in
    ``output_conflict`` naming what is there, nothing planted is touched, memory stays flat, and the
    daemon goes on and stops on time."""
    daemon = make_daemon(daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT})
    inbox = daemon.inbox
    # document -> (what lies at its sidecar name, its description)
    planted: dict[Path, tuple[Path, str]] = {}
    for index in range(7):
        os.mkfifo(inbox / f"fifo{index}.png.json")
        planted[inbox / f"fifo{index}.png"] = (inbox / f"fifo{index}.png.json", "a FIFO")
    (inbox / "zero.png.json").symlink_to("/dev/zero")
    planted[inbox / "zero.png"] = (inbox / "zero.png.json", "a symbolic link")
    for kind in ("json", "md"):
        (inbox / f"folder{kind}.png.{kind}").mkdir()
        planted[inbox / f"folder{kind}.png"] = (inbox / f"folder{kind}.png.{kind}", "a folder")
    (inbox / "theirs.png.json").write_text(USER_JSON)
    planted[inbox / "theirs.png"] = (inbox / "theirs.png.json", "a file ocrwatch did not write")
    daemon.start()
    for document in planted:
        docs.write_png(document, lines(document.stem))

    for document, (occupant, what) in planted.items():
        error = wait_until(
            lambda d=document: error_sidecar(d), 120, f"the error sidecar of {document.name}"
        )
        jsonschema.validate(error, ERROR_SCHEMA)
        assert error["error"]["kind"] == "output_conflict", error
        assert what in error["error"]["message"] and str(occupant) in error["error"]["hint"], error
        assert not error["error"]["retryable"]
        other = "md" if occupant.name.endswith(".json") else "json"
        assert not document.with_name(f"{document.name}.{other}").exists()  # nothing half-written
    for index in range(7):
        assert stat.S_ISFIFO((inbox / f"fifo{index}.png.json").lstat().st_mode)
    assert os.readlink(inbox / "zero.png.json") == "/dev/zero"
    assert (inbox / "folderjson.png.json").is_dir() and (inbox / "foldermd.png.md").is_dir()
    assert (inbox / "theirs.png.json").read_text() == USER_JSON
    assert {e["kind"] for e in events(daemon, "job_failed")} == {"output_conflict"}
    assert daemon.proc is not None
    peak_kib = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines()
            if line.startswith("VmHWM:")
        )
    )
    print(f"daemon peak RSS: {peak_kib / 1024:.0f} MiB")
    assert peak_kib < 1024 * 1024, "the daemon read from /dev/zero"

    carries_on(daemon, inbox, "after conflicts")
    stops_in_time(daemon)


# --- names whose sidecars cannot exist, and stale results -----------------------------------------


def test_a_250_byte_name_gets_one_clear_error_and_no_result(make_daemon) -> None:
    """NAME.md and NAME.json would fit in 255 bytes, NAME.error.json would not: the document fails
    with ``name_too_long`` before any sidecar is written, instead of writing a result and then
    failing."""
    daemon = make_daemon(daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT})
    daemon.start()
    long = docs.write_png(daemon.inbox / ("n" * 246 + ".png"), lines("long name"))
    assert len(os.fsencode(long.name)) == 250
    failed = wait_until(lambda: events(daemon, "job_failed", long), 60, "the long name's failure")
    # no .md, no .json, no temporary
    assert sorted(p.name for p in daemon.inbox.iterdir()) == [long.name]
    assert len(failed) == 1 and failed[0]["kind"] == "name_too_long", failed
    assert "261 bytes" in failed[0]["error"] and "shorter" in failed[0]["hint"]
    carries_on(daemon, daemon.inbox, "after a long name")
    assert len(events(daemon, "job_failed", long)) == 1
    stops_in_time(daemon)


def test_a_new_version_that_fails_removes_the_previous_result(make_daemon, tmp_path: Path) -> None:
    """report.pdf is OCR'd, then replaced by an encrypted PDF: the error sidecar appears and the
    previous content's report.pdf.md and report.pdf.json are gone, so no "ok" result stands for
    content no longer there."""
    daemon = make_daemon(daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT})
    daemon.start()
    report = docs.write_pdf(daemon.inbox / "report.pdf", [lines("first version")])
    assert (
        wait_until(lambda: sidecars_done(report), 60, "the first version's sidecars")["status"]
        == "ok"
    )
    replacement = docs.write_encrypted_pdf(tmp_path / "replacement.pdf")
    os.replace(replacement, report)
    error = wait_until(lambda: error_sidecar(report), 60, "the new version's error sidecar")
    assert error["error"]["kind"] == "encrypted_pdf"
    assert sorted(p.name for p in daemon.inbox.iterdir()) == ["report.pdf", "report.pdf.error.json"]
    carries_on(daemon, daemon.inbox, "after a failed new version")
    stops_in_time(daemon)


# --- faults of the place --------------------------------------------------------------------------


def _waits_without_using_attempts(daemon: DaemonProcess, document: Path, kind: str) -> None:
    """The document retries ``kind`` more often than its attempts allow, and never fails."""

    def six_retries() -> bool:
        assert not events(daemon, "job_failed"), "a fault of the place failed the document"
        return len([e for e in events(daemon, "job_retry") if e.get("kind") == kind]) >= 6

    wait_until(six_retries, 120, f"six {kind} retries (the document has 3 attempts)")
    retries = [e for e in events(daemon, "job_retry") if e.get("kind") == kind]
    assert all(e["counts"] is False and e["hint"] for e in retries), retries
    assert not events(daemon, "job_failed")
    row = ledger_row(daemon, document)
    assert row["state"] != "failed" and row["attempts"] <= 1 and row["error"]["kind"] == kind, row


def test_a_full_disk_is_waited_out_and_the_document_ends_ok_without_a_restart(
    make_daemon, tmpfs, tmp_path: Path
) -> None:
    small = tmpfs(tmp_path / "small", "1m")
    document = docs.write_png(small / "doc.png", lines("full disk"))
    filler = fill(small)
    daemon = make_daemon(
        inboxes=[{"path": str(small), "settle_seconds": 0.3}],
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT},
    )
    daemon.start()
    _waits_without_using_attempts(daemon, document, "disk_full")
    assert not sidecars_done(document)
    filler.unlink()
    data = wait_until(lambda: sidecars_done(document), 60, "the sidecars once space is free")
    assert data["status"] == "ok" and not error_sidecar(document)
    assert sorted(p.name for p in small.iterdir()) == ["doc.png", "doc.png.json", "doc.png.md"]
    # The JSON is the completion marker; the ledger row follows it a moment later.
    wait_until(
        lambda: ledger_row(daemon, document)["state"] == "done", 10, "the ledger row marked done"
    )
    carries_on(daemon, small, "after the full disk")
    stops_in_time(daemon)


def test_a_read_only_output_folder_is_waited_out(make_daemon, tmpfs, tmp_path: Path) -> None:
    """``output_not_writable`` is the place's fault: once the folder is writable again the document
    ends ok."""
    folder = tmpfs(tmp_path / "ro", "4m")
    document = docs.write_png(folder / "scan.png", lines("read only"))
    remount(folder, "ro")
    daemon = make_daemon(
        inboxes=[{"path": str(folder), "settle_seconds": 0.3}],
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT},
    )
    daemon.start()
    _waits_without_using_attempts(daemon, document, "output_not_writable")
    remount(folder, "rw")
    assert (
        wait_until(lambda: sidecars_done(document), 60, "the sidecars once writable")["status"]
        == "ok"
    )
    stops_in_time(daemon)


def test_a_read_only_state_tmp_is_waited_out(make_daemon, tmpfs, tmp_path: Path) -> None:
    """The document's private temporary folder under ``state_dir/tmp`` cannot be made: waited out
    too."""
    daemon = make_daemon(daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT})
    scratch = tmpfs(daemon.state / "tmp", "4m")
    daemon.start()
    remount(scratch, "ro")
    document = docs.write_png(daemon.inbox / "doc.png", lines("state tmp"))
    _waits_without_using_attempts(daemon, document, "output_not_writable")
    remount(scratch, "rw")
    assert (
        wait_until(lambda: sidecars_done(document), 60, "the sidecars once writable")["status"]
        == "ok"
    )
    stops_in_time(daemon)


def test_a_read_only_inbox_waits_and_output_dir_is_the_remedy(
    make_daemon, tmpfs, tmp_path: Path
) -> None:
    """Sources on a mount that stays read-only: the documents wait (never ``failed``, so no
    ``ocrwatch retry`` is needed), and SIGTERM ends their backoff at once instead of waiting
    ``shutdown_timeout`` for it; with ``[output] dir`` set and a restart, the sidecars go there and
    the sources are untouched."""
    folder = tmpfs(tmp_path / "ro-inbox", "4m")
    scan = docs.write_png(folder / "scan.png", lines("read only"))
    (folder / "sub").mkdir()
    nested = docs.write_png(folder / "sub" / "photo.png", lines("nested"))
    remount(folder, "ro")
    sources = {path: path.read_bytes() for path in (scan, nested)}
    daemon = make_daemon(
        inboxes=[{"path": str(folder), "settle_seconds": 0.3}],
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT},
        retry={"backoff_max_seconds": 60.0},
    )
    daemon.start()
    _waits_without_using_attempts(daemon, scan, "output_not_writable")
    retry = next(e for e in events(daemon, "job_retry") if e.get("kind") == "output_not_writable")
    assert "read-only" in retry["error"] and "[output] dir" in retry["hint"]
    stops_in_time(daemon)
    assert not events(daemon, "jobs_requeued_at_shutdown"), (
        "the shutdown waited for a backoff to end"
    )

    out = tmp_path / "out"
    daemon.config_path.write_text(daemon.config_path.read_text() + f'\n[output]\ndir = "{out}"\n')
    daemon.start()
    out = out / "ro-inbox"  # the inbox's own folder there
    wait_until(
        lambda: (out / "scan.png.json").exists() and (out / "sub" / "photo.png.json").exists(),
        60,
        "sidecars under [output] dir",
    )
    assert json.loads((out / "scan.png.json").read_text())["status"] == "ok"
    assert {path: path.read_bytes() for path in sources} == sources
    stops_in_time(daemon)
