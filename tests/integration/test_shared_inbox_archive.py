"""``on_success`` on a shared, sticky inbox used by two real users through a root daemon.

A move takes only what ocrwatch wrote for the document (Bob's own files beside Alice's stay, his),
keeps the source's owner and mode on another filesystem (Alice reads her archived copy, Bob cannot),
and a delete never takes a file that a process still holds open for writing: it is processed again
once the writer is done.
"""

from __future__ import annotations

import importlib.util
import stat
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.integration.conftest import REPO, DaemonProcess, sidecars_done, wait_until
from tests.support import docs
from tests.support.users import User, sys_python

pytestmark = pytest.mark.integration

WRITER = """
import sys
chunks = [bytes.fromhex(line) for line in sys.argv[2:]]
with open(sys.argv[1], "wb") as handle:  # kept open: the complete PDF, a pause, then the update
    handle.write(chunks[0])
    handle.flush()
    print("written", flush=True)
    sys.stdin.readline()
    for chunk in chunks[1:]:
        handle.write(chunk)
"""


def drop(user: User, staged: Path, target: Path, mode: int) -> None:
    """``user`` copies ``staged`` into the inbox as ``target``, theirs with ``mode``, as a person
    would."""
    done = user.run(
        [
            "sh",
            "-c",
            f'cp "$1" "$2.part" && chmod {mode:o} "$2.part" && mv "$2.part" "$2"',
            "sh",
            str(staged),
            str(target),
        ]
    )
    assert done.returncode == 0, done.stderr


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [event for event in daemon.events() if event.get("event") == name]


def incremental_pdf() -> ModuleType:
    """The red team's incremental-update PDF builder (``../shared/redteam``), for its ``build``."""
    script = REPO.parent / "shared" / "redteam" / "incremental_pdf.py"
    if not script.is_file():
        pytest.skip(f"{script} is absent")
    spec = importlib.util.spec_from_file_location("incremental_pdf", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_move_takes_only_ocrwatchs_outputs_and_keeps_owner_and_mode_on_another_filesystem(
    make_daemon: Any, users: tuple[User, User], shared_root: Path, tmpfs: Any
) -> None:
    alice, bob = users
    inbox, archive = shared_root / "inbox", tmpfs(shared_root / "archive", "64m")
    stage = shared_root / "stage"
    stage.mkdir()
    staged = docs.write_png(stage / "report.png", ("QUARTERLY REPORT",))
    staged.chmod(0o644)
    for command in (
        ["mkdir", str(inbox / "report.png.assets")],
        ["sh", "-c", f'echo "my own PDF" > "{inbox}/report.png.ocr.pdf"'],
        ["sh", "-c", f'echo "my own hOCR" > "{inbox}/report.png.hocr"'],
        ["sh", "-c", f'echo "chapter one" > "{inbox}/report.png.assets/chapter1.txt"'],
    ):
        assert bob.run(command).returncode == 0
    daemon = make_daemon(
        inboxes=[
            {
                "path": str(inbox),
                "settle_seconds": 0.3,
                "polling": False,
                "on_success": "move",
                "formats": ["md", "json", "alto"],  # the inbox's, not [output]'s
            }
        ],
        output={"archive_dir": str(archive)},
    ).start()
    drop(alice, staged, inbox / "report.png", 0o600)
    moved = archive / "inbox" / "report.png"
    wait_until(
        lambda: sidecars_done(moved), 90, f"the archived JSON sidecar:\n{daemon.log_text()[-3000:]}"
    )
    assert daemon.stop() == 0

    assert sorted(p.name for p in moved.parent.iterdir()) == [
        "report.png",
        "report.png.alto.xml",
        "report.png.json",
        "report.png.md",
    ]
    for path in (moved, *(moved.with_name(f"report.png.{s}") for s in ("md", "json", "alto.xml"))):
        info = path.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
            alice.uid,
            alice.gid,
            0o600,
        ), path
    # a PNG: its size, not its bytes
    copied = alice.run(["sh", "-c", 'cat "$1" | wc -c', "sh", str(moved)])
    assert copied.stdout.strip() == str(staged.stat().st_size), (
        f"Alice reads her archived copy: {copied}"
    )
    assert "QUARTERLY" in alice.run(["cat", str(moved.with_name("report.png.md"))]).stdout.upper()
    for path in (moved, moved.with_name("report.png.md"), moved.with_name("report.png.alto.xml")):
        assert bob.run(["cat", str(path)]).returncode != 0, f"Bob read {path}"
    assert stat.S_IMODE(moved.parent.stat().st_mode) & 0o022 == 0, (
        "no one but root writes in the archive's folder"
    )
    for name in (
        "report.png.ocr.pdf",
        "report.png.hocr",
        "report.png.assets/chapter1.txt",
        "report.png.assets",
    ):
        assert (inbox / name).lstat().st_uid == bob.uid, name  # Bob's stay where he put them, his
    assert (inbox / "report.png.ocr.pdf").read_text() == "my own PDF\n"
    assert (inbox / "report.png.hocr").read_text() == "my own hOCR\n"
    assert not (inbox / "report.png").exists()


def test_delete_waits_for_a_writer_that_holds_the_file_open_then_takes_the_finished_file(
    make_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    alice, _ = users
    inbox = shared_root / "inbox"
    # a complete one-page PDF, then an update adding a second page
    chunks = incremental_pdf().build(2)
    daemon = make_daemon(
        inboxes=[
            {"path": str(inbox), "settle_seconds": 0.3, "polling": False, "on_success": "delete"}
        ],
    ).start()
    source = inbox / "growing.pdf"
    writer = alice.popen(
        [sys_python(), "-c", WRITER, str(source), *(chunk.hex() for chunk in chunks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        kept = wait_until(
            lambda: events(daemon, "source_kept"),
            90,
            f"the source kept:\n{daemon.log_text()[-3000:]}",
        )
        assert kept[0]["reason"] == "open_for_writing"
        assert source.read_bytes() == chunks[0], "not deleted while a writer holds it"
        first = sidecars_done(source)
        assert first is not None and len(first["pages"]) == 1
    finally:
        assert writer.stdin is not None
        writer.stdin.write("\n")
        writer.stdin.close()
        writer.wait(30)
    assert writer.returncode == 0
    wait_until(
        lambda: not source.exists(), 90, f"the finished file deleted:\n{daemon.log_text()[-3000:]}"
    )
    assert daemon.stop() == 0
    document = sidecars_done(source)
    assert document is not None and len(document["pages"]) == 2, (
        "what was deleted is what was processed last"
    )
    assert [e["reason"] for e in events(daemon, "source_kept")] == ["open_for_writing"]
    assert len(events(daemon, "source_deleted")) == 1
