"""A shared, sticky inbox used by two real users through a root daemon: what one user can do to
another.

Each test acts as real local users (``useradd``, then ``setpriv``), so the kernel's permission
checks decide: outputs are never readable by more people than their source, another user's file is
never replaced or removed for a document that is not its owner's, and a folder swapped for a symlink
never sends a write outside the inbox.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.users import User, sys_python

pytestmark = pytest.mark.integration

RACE_SECONDS = 15.0
FORMATS = ["md", "json", "alto", "hocr"]
"""Every file a document may get beside the searchable PDF: the ALTO and hOCR files go through the
same sink, so each promise holds for them too."""

EXCHANGE = """
import ctypes, glob, os, sys, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
a, b, seconds = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])


def exchange():
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")


# At the right moment: the first output of a document has appeared, the rest are still to come.
end, flips, seen = time.monotonic() + seconds, 0, set()
while time.monotonic() < end and len(seen) < 3:
    fresh = set(glob.glob(os.path.join(a.decode(), "*.md"))) - seen
    if fresh:
        exchange()
        time.sleep(1.0)
        exchange()
        seen |= fresh
        flips += 2
# Blindly, as fast as can be, for the rest of the time.
while time.monotonic() < end:
    exchange()
    flips += 1
if os.path.islink(a):
    exchange()
print(flips)
"""


def drop(user: User, staged: Path, target: Path, mode: int = 0o644) -> None:
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


def staged_png(shared_root: Path, name: str, text: str) -> Path:
    stage = shared_root / "stage"
    stage.mkdir(exist_ok=True)
    path = docs.write_png(stage / name, (text,))
    path.chmod(0o644)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def daemon_on(make_daemon, shared_root: Path, **output: object) -> DaemonProcess:  # type: ignore[no-untyped-def]
    inbox = {"path": str(shared_root / "inbox"), "settle_seconds": 0.3, "polling": False}
    return make_daemon(inboxes=[inbox], output=output) if output else make_daemon(inboxes=[inbox])


def test_a_private_documents_outputs_are_readable_by_its_owner_alone(
    make_daemon, users, shared_root: Path
) -> None:
    alice, bob = users
    inbox = shared_root / "inbox"
    daemon = daemon_on(make_daemon, shared_root, searchable_pdf=True, formats=FORMATS).start()
    drop(
        alice,
        staged_png(shared_root, "salary.png", "SALARY LIST FOR MARCH"),
        inbox / "salary.png",
        0o600,
    )
    wait_until(
        lambda: sidecars_done(inbox / "salary.png"),
        90,
        f"the sidecars:\n{daemon.log_text()[-3000:]}",
    )
    outputs = ("md", "json", "ocr.pdf", "alto.xml", "hocr")
    for name in (f"salary.png.{suffix}" for suffix in outputs):
        info = (inbox / name).lstat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
            alice.uid,
            alice.gid,
            0o600,
        ), name
        assert bob.run(["cat", str(inbox / name)]).returncode != 0, f"{bob.name} read {name}"
    mine = alice.run(["cat", str(inbox / "salary.png.md")])
    assert mine.returncode == 0 and "SALARY" in mine.stdout.upper(), mine
    leftovers = [p.name for p in inbox.iterdir() if ".ocrwatch-tmp-" in p.name]
    assert not leftovers, leftovers

    # A readable source's outputs are readable as it is, and still its owner's.
    drop(bob, staged_png(shared_root, "notice.png", "PUBLIC NOTICE"), inbox / "notice.png", 0o644)
    wait_until(lambda: sidecars_done(inbox / "notice.png"), 90, "the public notice's sidecars")
    info = (inbox / "notice.png.md").lstat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (bob.uid, 0o644)
    assert alice.run(["cat", str(inbox / "notice.png.md")]).returncode == 0
    assert daemon.stop() == 0


def test_outputs_made_for_one_user_are_never_replaced_or_removed_for_another(
    make_daemon, users, shared_root: Path
) -> None:
    """Alice keeps what ocrwatch made of her report.png after removing the scan itself; Bob drops
    his own report.png. Her outputs carry ocrwatch's marks and the record of them matches, but they
    were made from her document, not his: his document fails as ``output_conflict`` naming them, and
    they stay as they are. So for each file of ``[output] formats`` alone: her memo.png's ALTO and
    hOCR files kept without the sidecars, Bob's own file at an ALTO name, his link to a file of
    root's at an hOCR name, and root's own file at an ALTO name that Bob's hand-made JSON claims
    (only a JSON of the daemon's user says which outputs an older ocrwatch wrote)."""
    alice, bob = users
    inbox, vault = shared_root / "inbox", shared_root / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret.txt"
    secret.write_text("root's own secret\n")
    roots = inbox / "ledger.png.alto.xml"
    roots.write_text("root's own ALTO\n")
    claim = '{"schema": "ocrwatch/1", "alto": {"path": "ledger.png.alto.xml"}}\n'
    for command in (
        ["sh", "-c", 'echo "my own ALTO" > "$1"', "sh", str(inbox / "notes.png.alto.xml")],
        ["ln", "-s", str(secret), str(inbox / "chart.png.hocr")],
        ["sh", "-c", 'printf %s "$1" > "$2"', "sh", claim, str(inbox / "ledger.png.json")],
    ):
        assert bob.run(command).returncode == 0, command
    daemon = daemon_on(make_daemon, shared_root, searchable_pdf=True, formats=FORMATS).start()
    drop(alice, staged_png(shared_root, "a.png", "ALICE QUARTERLY REPORT"), inbox / "report.png")
    drop(alice, staged_png(shared_root, "m.png", "ALICE MEMO"), inbox / "memo.png")
    for name in ("notes.png", "chart.png", "ledger.png"):
        drop(bob, staged_png(shared_root, name, f"BOB {name.upper()}"), inbox / name)
    for name in ("report.png", "memo.png"):
        wait_until(
            lambda name=name: sidecars_done(inbox / name),
            90,
            lambda: f"Alice's sidecars:\n{daemon.log_text()[-3000:]}",
        )
    suffixes = ("md", "json", "ocr.pdf", "alto.xml", "hocr")
    outputs = {
        name: inbox / name
        for name in (*(f"report.png.{s}" for s in suffixes), "memo.png.alto.xml", "memo.png.hocr")
    }
    before = {name: sha(path) for name, path in outputs.items()}
    assert alice.run(["rm", str(inbox / "report.png")]).returncode == 0
    memo = [str(inbox / f"memo.png{s}") for s in ("", ".md", ".json", ".ocr.pdf")]
    assert alice.run(["rm", *memo]).returncode == 0

    drop(bob, staged_png(shared_root, "b.png", "BOB JUNK"), inbox / "report.png")
    drop(bob, staged_png(shared_root, "c.png", "BOB MEMO"), inbox / "memo.png")

    def outcome(name: str) -> dict[str, Any] | None:
        """The error of Bob's document ``name``, or at once, not after a wait, word that its
        Markdown was written instead (report.png's is Alice's: only its error counts)."""
        if (error := error_sidecar(inbox / name)) is not None:
            return dict(error["error"])
        published = name != "report.png" and (inbox / f"{name}.md").exists()
        return {"kind": "none: its Markdown was written"} if published else None

    failed = {
        name: wait_until(
            lambda name=name: outcome(name),
            90,
            lambda: f"Bob's errors:\n{daemon.log_text()[-3000:]}",
        )
        for name in ("report.png", "memo.png", "notes.png", "chart.png", "ledger.png")
    }
    taken = {
        "report.png": ("another user", "report.png."),
        "memo.png": ("another user", "memo.png.alto.xml"),
        "notes.png": ("a file ocrwatch did not write", "notes.png.alto.xml"),
        "chart.png": ("a symbolic link", "chart.png.hocr"),
        "ledger.png": ("a file ocrwatch did not write", "ledger.png.json"),
    }
    for name, (what, where) in taken.items():
        error = failed[name]
        assert error["kind"] == "output_conflict", (name, error)
        assert what in error["message"] and where in error["message"], (name, error)
        assert (inbox / f"{name}.error.json").lstat().st_uid == bob.uid
        if name != "report.png":  # nothing half-written
            assert not (inbox / f"{name}.md").exists(), name
    assert {name: sha(path) for name, path in outputs.items()} == before
    assert all(path.lstat().st_uid == alice.uid for path in outputs.values())
    assert (inbox / "notes.png.alto.xml").read_text() == "my own ALTO\n"
    assert (inbox / "notes.png.alto.xml").lstat().st_uid == bob.uid
    assert os.readlink(inbox / "chart.png.hocr") == str(secret)
    assert secret.read_text() == "root's own secret\n" and secret.stat().st_uid == 0
    assert roots.read_text() == "root's own ALTO\n" and roots.lstat().st_uid == 0
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_a_folder_swapped_for_a_symlink_never_sends_a_write_outside_the_inbox(
    make_daemon, users, shared_root: Path
) -> None:
    """Bob swaps his folder for a symlink to a root-only folder, back and forth as fast as he can,
    while his documents are processed with every output on: nothing is written, renamed or removed
    there."""
    alice, bob = users
    inbox, vault = shared_root / "inbox", shared_root / "vault"
    vault.mkdir(mode=0o700)
    (vault / "doc-1.png.md").write_text("root's own notes\n")
    (vault / "doc-1.png.json").write_text('{"schema": "ocrwatch/1", "mine": true}\n')
    before = {p.name: sha(p) for p in vault.iterdir()}
    assert bob.run(["mkdir", "-m", "755", str(inbox / "bob")]).returncode == 0
    assert bob.run(["ln", "-s", str(vault), str(inbox / "bob-link")]).returncode == 0
    inbox_cfg = {"path": str(inbox), "settle_seconds": 0.3, "polling": False}
    daemon = make_daemon(
        inboxes=[inbox_cfg], output={"searchable_pdf": True}, daemon={"reconcile_seconds": 2.0}
    )
    daemon.start()
    for index in range(1, 6):
        staged = staged_png(shared_root, f"doc-{index}.png", f"BOB PAGE {index}")
        drop(bob, staged, inbox / "bob" / f"doc-{index}.png")
    racer = bob.popen(
        [
            sys_python(),
            "-c",
            EXCHANGE,
            str(inbox / "bob"),
            str(inbox / "bob-link"),
            str(RACE_SECONDS),
        ],
        stdout=-1,
        stderr=-1,
    )
    deadline = time.monotonic() + RACE_SECONDS + 30
    out, err = racer.communicate(timeout=RACE_SECONDS + 30)
    assert racer.returncode == 0 and int(out) > 1000, (out, err)
    assert {p.name: sha(p) for p in vault.iterdir()} == before, sorted(os.listdir(vault))
    assert all(p.lstat().st_uid == 0 for p in vault.iterdir())
    assert not (inbox / "bob").is_symlink()
    # Once the race is over every document ends with its sidecars or an error sidecar, in Bob's
    # folder.
    for index in range(1, 6):
        source = inbox / "bob" / f"doc-{index}.png"
        wait_until(
            lambda source=source: sidecars_done(source) or error_sidecar(source),
            max(deadline - time.monotonic(), 60),
            lambda source=source: f"{source.name}'s outcome:\n{daemon.log_text()}",
        )
    assert {p.name: sha(p) for p in vault.iterdir()} == before
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log_text()
