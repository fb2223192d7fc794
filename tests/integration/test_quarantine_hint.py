"""``quarantine_dir`` and the hints of the failures it sees, through ``ocrwatch run`` as a real
process: a document failed for a fault beside it (a file at its sidecar's name) stays where its
hint's fix and ``ocrwatch retry`` find it, while one whose own bytes are at fault is moved aside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.test_hooks import RECORDER, records, script

pytestmark = pytest.mark.integration


def cli(daemon: DaemonProcess, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrwatch", *map(str, args), "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=daemon.root,
    )


def named(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e.get("event") == event]


def test_an_output_conflict_stays_in_place_so_its_hint_and_retry_work(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    quarantine, inbox, out = tmp_path / "quarantine", tmp_path / "inbox", tmp_path / "received"
    recorder = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    daemon = plugin_daemon(
        inboxes=[{"path": str(inbox), "settle_seconds": 0.3, "quarantine_dir": str(quarantine)}],
        hook=[{"name": "failures", "command": recorder, "on": ["failed"]}],
    ).start()
    try:
        theirs = inbox / "report.pdf.md"
        theirs.mkdir()  # a folder of the user's at the Markdown sidecar's name
        source = docs.write_pdf(inbox / "report.pdf", [["Quarterly report"]])
        corrupt = docs.write_corrupt_pdf(inbox / "broken.pdf")
        error = wait_until(lambda: error_sidecar(source), 60, "the output_conflict failure")
        assert error["error"]["kind"] == "output_conflict"
        moved = wait_until(lambda: named(daemon, "local_quarantined"), 60, "broken.pdf quarantined")
        assert [Path(e["path"]).name for e in moved] == ["broken.pdf"]  # its own bytes are at fault
        assert (quarantine / "broken.pdf").exists() and not corrupt.exists()
        assert source.exists() and not (quarantine / "report.pdf").exists()
        told = wait_until(lambda: len(records(out)) == 2 and records(out), 30, "both hooks")
        env = {unquote(urlsplit(r["env"]["OCRWATCH_ORIGINAL"]).path): r["env"] for r in told}
        env = {Path(path).name: each for path, each in env.items()}
        assert env["report.pdf"]["OCRWATCH_SOURCE"] == source.as_uri()  # where it stays
        assert env["report.pdf"]["OCRWATCH_JSON"] == str(source.with_name("report.pdf.error.json"))
        # The quarantined one is named where it went, its error sidecar too.
        assert env["broken.pdf"]["OCRWATCH_SOURCE"] == (quarantine / "broken.pdf").as_uri()
        assert env["broken.pdf"]["OCRWATCH_JSON"] == str(quarantine / "broken.pdf.error.json")
        assert Path(env["broken.pdf"]["OCRWATCH_JSON"]).is_file()

        theirs.rmdir()  # what the hint says to do, then `ocrwatch retry`, as it says
        assert "`ocrwatch retry`" in error["error"]["hint"]
        proc = cli(daemon, "retry", source)
        assert proc.returncode == 0, proc.stderr
        data = wait_until(
            lambda: not error_sidecar(source) and sidecars_done(source),
            60,
            "the retried document's sidecars, its error sidecar gone",
        )
        assert data["status"] == "ok" and source.with_name("report.pdf.md").is_file()
        assert source.exists()
        assert not named(daemon, "local_quarantine_failed")
        assert sorted(e["kind"] for e in named(daemon, "job_failed")) == [
            "corrupt_pdf",
            "output_conflict",
        ]
    finally:
        assert daemon.stop() == 0


def test_a_document_failed_before_a_quarantine_was_set_is_moved_at_the_next_start(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    """A corrupt document failed while its inbox had no quarantine_dir; one is set and the daemon
    started again: the start's scan finds it failed with the very content it has, and sets it aside
    with its error sidecar (ocrwatch's by the record of outputs), running nothing."""
    inbox, quarantine = tmp_path / "inbox", tmp_path / "quarantine"
    first = plugin_daemon(inboxes=[{"path": str(inbox), "settle_seconds": 0.3}]).start()
    try:
        corrupt = docs.write_corrupt_pdf(inbox / "broken.pdf")
        failed = wait_until(lambda: error_sidecar(corrupt), 60, "the corrupt_pdf failure")
        assert failed["error"]["kind"] == "corrupt_pdf"
    finally:
        assert first.stop() == 0
    config = {"path": str(inbox), "settle_seconds": 0.3, "quarantine_dir": str(quarantine)}
    second = plugin_daemon(inboxes=[config]).start()
    try:
        wait_until(lambda: named(second, "local_quarantined"), 60, "broken.pdf set aside")
        assert not corrupt.exists() and (quarantine / "broken.pdf").is_file()
        assert (quarantine / "broken.pdf.error.json").is_file()
        assert not named(second, "job_started") and not named(second, "local_quarantine_skipped")
    finally:
        assert second.stop() == 0
