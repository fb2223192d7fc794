"""The same bytes dropped twice through ``ocrwatch run``: the copy takes the earlier result (its
Markdown as written, ``reused_from`` naming the first file) with no second OCR, and its hook runs;
``duplicates = "ocr"`` reads it again; and a copy dropped by another user is read again, so a drop
never tells one user what another has."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until
from tests.integration.test_shared_inbox import daemon_on, drop, staged_png
from tests.support import docs
from tests.support.users import User
from tests.test_hooks import RECORDER, records, script

pytestmark = pytest.mark.integration

TEXT = ["INVOICE 4711", "Total due: 120 EUR"]


def recognised_pages(daemon: DaemonProcess) -> float:
    """Pages the engine read, from the daemon's own metrics."""
    total = 0.0
    for line in daemon.metrics().splitlines():
        if line.startswith("ocrwatch_pages_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def dropped(daemon: DaemonProcess, name: str, like: Path | None = None) -> Path:
    """A PNG made beside the inbox and renamed in, or a byte-for-byte copy of ``like``."""
    staging = daemon.root / "staging"
    staging.mkdir(exist_ok=True)
    staged = shutil.copyfile(like, staging / name) if like else docs.write_png(staging / name, TEXT)
    target = daemon.inbox / name
    Path(staged).rename(target)
    return target


def test_a_copy_of_a_done_file_takes_its_result_without_a_second_ocr_and_runs_its_hook(
    make_daemon: Any, tmp_path: Path
) -> None:
    out = tmp_path / "received"
    record = [sys.executable, script(tmp_path, "r.py", RECORDER), str(out)]
    daemon = make_daemon(hook=[{"name": "record", "command": record}]).start()
    first = dropped(daemon, "invoice.png")
    original = wait_until(lambda: sidecars_done(first), 60, "the first sidecars")
    assert original["status"] == "ok" and "reused_from" not in original
    read = recognised_pages(daemon)
    assert read == 1

    copy = dropped(daemon, "invoice.1.png", like=first)
    result = wait_until(lambda: sidecars_done(copy), 60, "the copy's sidecars")
    assert result["reused_from"] == first.as_uri()
    assert result["source"]["uri"] == copy.as_uri() and result["source"]["name"] == "invoice.1.png"
    assert result["source"]["sha256"] == original["source"]["sha256"]
    assert result["pages"] == original["pages"]
    assert (daemon.inbox / "invoice.1.png.md").read_bytes() == (
        daemon.inbox / "invoice.png.md"
    ).read_bytes()
    assert recognised_pages(daemon) == read  # the engine read nothing more
    received = wait_until(lambda: len(records(out)) == 2 and records(out), 30, "both hooks")
    assert {r["env"]["OCRWATCH_SOURCE"] for r in received} == {first.as_uri(), copy.as_uri()}

    # A user's edit of an earlier Markdown is theirs: it is never copied, the copy is read again.
    for name in ("invoice.png.md", "invoice.1.png.md"):
        (daemon.inbox / name).write_text("edited by hand\n")
    again = dropped(daemon, "invoice.2.png", like=first)
    edited = wait_until(lambda: sidecars_done(again), 60, "the third copy's sidecars")
    assert "reused_from" not in edited and recognised_pages(daemon) == read + 1
    assert daemon.stop() == 0


def test_duplicates_ocr_reads_every_copy_again(make_daemon: Any, tmp_path: Path) -> None:
    inbox = {"path": str(tmp_path / "inbox"), "settle_seconds": 0.3, "duplicates": "ocr"}
    daemon = make_daemon(inboxes=[inbox]).start()
    first = dropped(daemon, "scan.png")
    wait_until(lambda: sidecars_done(first), 60, "the first sidecars")
    copy = dropped(daemon, "scan.1.png", like=first)
    result = wait_until(lambda: sidecars_done(copy), 60, "the copy's sidecars")
    assert "reused_from" not in result and recognised_pages(daemon) == 2
    assert daemon.stop() == 0


def test_a_copy_dropped_by_another_user_is_read_again(
    make_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    alice, bob = users
    inbox = shared_root / "inbox"
    daemon = daemon_on(make_daemon, shared_root).start()
    staged = staged_png(shared_root, "contract.png", "CONTRACT OF ALICE")
    drop(alice, staged, inbox / "contract.png")
    wait_until(lambda: sidecars_done(inbox / "contract.png"), 90, "Alice's sidecars")
    drop(bob, staged, inbox / "mine.png")
    result = wait_until(lambda: sidecars_done(inbox / "mine.png"), 90, "Bob's sidecars")
    assert "reused_from" not in result and recognised_pages(daemon) == 2
    assert (inbox / "mine.png.md").lstat().st_uid == bob.uid
    drop(alice, staged, inbox / "contract-copy.png")  # her own copy takes her result
    mine = wait_until(lambda: sidecars_done(inbox / "contract-copy.png"), 90, "Alice's copy")
    assert mine["reused_from"] == (inbox / "contract.png").as_uri()
    assert daemon.stop() == 0
