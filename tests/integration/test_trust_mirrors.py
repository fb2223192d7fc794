"""Folders that stand for inbox folders under ``[output] dir``, ``archive_dir`` and
``quarantine_dir``, with a root daemon and two real users on a sticky shared inbox.

Each folder ocrwatch makes there gets the owner, group and mode of the inbox folder it stands for
(less write for others and the umask), so a user's private folder stays private in its mirrors; and
one already there that is not as ocrwatch would make it now (made by another user first, or made
for an inbox folder that has since changed hands) is never written through: the document fails as
``untrusted_folder`` naming it, or its move is refused, and it comes back once the folder is fixed.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.users import User

pytestmark = pytest.mark.integration

ECHO = "tests.support.fault_engines:EchoEngine"
BROKEN = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def owned(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def as_user(user: User, *command: str) -> None:
    done = user.run(list(command))
    assert done.returncode == 0, f"{user.name}: {command}: {done.stderr}"


def drop(user: User, shared_root: Path, target: Path, mode: int, data: bytes | None = None) -> Path:
    """``user`` puts a one-page PNG (or ``data``) at ``target``, theirs with ``mode``, renamed in
    when whole."""
    stage = shared_root / "stage"
    stage.mkdir(exist_ok=True)
    staged = stage / target.name
    if data is None:
        docs.write_png(staged, (f"{target.stem.upper()} OF {user.name.upper()}",))
    else:
        staged.write_bytes(data)
    staged.chmod(0o644)
    script = f'cp "$1" "$2.part" && chmod {mode:o} "$2.part" && mv "$2.part" "$2"'
    as_user(user, "sh", "-c", script, "sh", str(staged), str(target))
    return target


def root_folder(path: Path) -> Path:
    """A root the daemon is given: made beforehand by root, writable by root alone."""
    path.mkdir()
    path.chmod(0o755)
    return path


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [event for event in daemon.events() if event.get("event") == name]


def shared_daemon(plugin_daemon: Any, shared_root: Path, **settings: Any) -> DaemonProcess:
    inbox = {"path": str(shared_root / "inbox"), "settle_seconds": 0.3, "polling": False}
    inbox.update(settings.pop("inbox", {}))
    return plugin_daemon(ECHO, inboxes=[inbox], **settings)


def test_mirrors_under_output_dir_are_as_private_as_the_inbox_folders_they_stand_for(
    plugin_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    """Alice keeps readable files in her own 0700 folder, and a team's in a 0750 one: their mirrors
    are hers with those modes, so Bob neither lists her names nor reads her Markdown, searchable PDF
    or error sidecar there; the shared inbox's own mirror is not writable by others."""
    alice, bob = users
    inbox, out = shared_root / "inbox", root_folder(shared_root / "out")
    for name, mode in (("alice", 0o700), ("team", 0o750)):
        as_user(alice, "mkdir", str(inbox / name))
        as_user(alice, "chmod", f"{mode:o}", str(inbox / name))
    daemon = shared_daemon(
        plugin_daemon, shared_root, output={"dir": str(out), "searchable_pdf": True}
    ).start()
    report = drop(alice, shared_root, inbox / "alice" / "report.png", 0o644)
    drop(alice, shared_root, inbox / "alice" / "broken.pdf", 0o644, BROKEN)
    drop(alice, shared_root, inbox / "team" / "plan.png", 0o644)
    mirror = out / "inbox"
    wait_until(
        lambda: (
            sidecars_done(mirror / "alice" / report.name)
            and error_sidecar(mirror / "alice" / "broken.pdf")
            and sidecars_done(mirror / "team" / "plan.png")
        ),
        90,
        lambda: f"the sidecars under {out}:\n{daemon.log_text()[-3000:]}",
    )
    assert daemon.stop() == 0

    assert owned(mirror) == (0, 0, 0o755)
    assert owned(mirror / "alice") == (alice.uid, alice.gid, 0o700)
    assert owned(mirror / "team") == (alice.uid, alice.gid, 0o750)
    for folder in (mirror / "alice", mirror / "team"):
        assert bob.run(["ls", str(folder)]).returncode != 0, f"{bob.name} listed {folder}"
    for name in ("report.png.md", "report.png.ocr.pdf", "broken.pdf.error.json"):
        path = mirror / "alice" / name
        assert path.exists(), name
        assert bob.run(["cat", str(path)]).returncode != 0, f"{bob.name} read {path}"
    mine = alice.run(["cat", str(mirror / "alice" / "report.png.md")])
    assert mine.returncode == 0 and "Echo of a" in mine.stdout, mine


def test_a_mirror_not_as_ocrwatch_makes_it_is_never_written_through_and_the_document_comes_back(
    plugin_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    """A mirror of Alice's private folder left root 0755 (as an earlier version made it): her
    document fails as ``untrusted_folder`` naming it, and nothing is written there; once the folder
    is moved away, as the hint says, the document is taken again and its sidecars land in a mirror
    that is hers."""
    alice, bob = users
    inbox, out = shared_root / "inbox", root_folder(shared_root / "out")
    as_user(alice, "mkdir", "-m", "700", str(inbox / "alice"))
    stale = out / "inbox" / "alice"
    stale.mkdir(parents=True)
    stale.chmod(0o755)
    (out / "inbox").chmod(0o755)
    daemon = shared_daemon(
        plugin_daemon, shared_root, output={"dir": str(out)}, daemon={"reconcile_seconds": 1.0}
    ).start()
    drop(alice, shared_root, inbox / "alice" / "report.png", 0o644)
    sidecar = stale / "report.png.json"
    wait_until(
        lambda: events(daemon, "job_failed") or sidecar.exists(),
        90,
        lambda: f"the document's outcome:\n{daemon.log_text()[-3000:]}",
    )
    assert not sidecar.exists() and list(stale.iterdir()) == [], "written through the mirror"
    failed = events(daemon, "job_failed")[0]
    assert failed["kind"] == "untrusted_folder", failed
    assert str(stale) in failed["error"] and "0755" in failed["error"], failed
    assert f"{alice.uid} ({alice.name})" in failed["error"] and "0700" in failed["error"], failed
    assert str(stale) in failed["hint"] and "move it away" in failed["hint"], failed

    stale.rename(out / "inbox" / "alice.old")
    done = wait_until(
        lambda: sidecars_done(stale / "report.png"),
        90,
        lambda: f"the document taken again:\n{daemon.log_text()[-3000:]}",
    )
    assert daemon.stop() == 0
    assert done["status"] == "ok"
    assert owned(stale) == (alice.uid, alice.gid, 0o700)
    assert bob.run(["ls", str(stale)]).returncode != 0


def test_an_archive_folder_made_for_a_folder_that_changed_hands_is_not_moved_into(
    plugin_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    """Alice's ``projects`` folder is mirrored in the archive as hers. She removes it; Bob makes his
    own private ``projects``: his document is done, but never archived into Alice's folder (where
    she could read and delete it); it stays in his, and the refusal names the folder."""
    alice, bob = users
    inbox, archive = shared_root / "inbox", root_folder(shared_root / "archive")
    projects = inbox / "projects"
    as_user(alice, "mkdir", "-m", "755", str(projects))
    daemon = shared_daemon(
        plugin_daemon,
        shared_root,
        inbox={"on_success": "move"},
        output={"archive_dir": str(archive)},
    ).start()
    drop(alice, shared_root, projects / "hers.png", 0o644)
    kept = archive / "inbox" / "projects"
    wait_until(
        lambda: sidecars_done(kept / "hers.png"),
        90,
        lambda: f"Alice's document archived:\n{daemon.log_text()[-3000:]}",
    )
    assert owned(kept) == (alice.uid, alice.gid, 0o755)
    as_user(alice, "rmdir", str(projects))
    as_user(bob, "mkdir", "-m", "700", str(projects))
    his = drop(bob, shared_root, projects / "his.png", 0o600)
    wait_until(
        lambda: events(daemon, "source_not_archived") or events(daemon, "source_archived")[1:],
        90,
        lambda: f"Bob's document's move:\n{daemon.log_text()[-3000:]}",
    )
    assert daemon.stop() == 0
    assert sorted(p.name for p in kept.iterdir()) == ["hers.png", "hers.png.json", "hers.png.md"]
    refused = events(daemon, "source_not_archived")[0]
    assert refused["kind"] == "untrusted_folder" and str(kept) in refused["error"], refused
    assert his.exists() and sidecars_done(his) is not None
    assert owned(his) == (bob.uid, bob.gid, 0o600)


def test_a_quarantine_folder_another_user_made_first_is_not_moved_into(
    plugin_daemon: Any, users: tuple[User, User], shared_root: Path
) -> None:
    """The quarantine inside the shared inbox; Bob made the folder that stands for Alice's private
    folder there before her document failed: her file is not moved into his folder (where he could
    delete it); it stays where she put it, with its error sidecar, and the refusal names the
    folder."""
    alice, bob = users
    inbox = shared_root / "inbox"
    failed = inbox / ".failed"
    failed.mkdir(mode=0o1777)
    failed.chmod(0o1777)  # once open to all: Bob makes his folder
    as_user(bob, "mkdir", "-m", "700", str(failed / "alice"))
    failed.chmod(0o755)  # then locked down, as a root is
    as_user(alice, "mkdir", "-m", "700", str(inbox / "alice"))
    daemon = shared_daemon(plugin_daemon, shared_root, inbox={"quarantine_dir": str(failed)})
    daemon.start()
    broken = drop(alice, shared_root, inbox / "alice" / "broken.pdf", 0o600, BROKEN)
    wait_until(
        lambda: events(daemon, "local_quarantine_failed") or events(daemon, "local_quarantined"),
        90,
        lambda: f"the quarantine's outcome:\n{daemon.log_text()[-3000:]}",
    )
    assert daemon.stop() == 0
    assert list((failed / "alice").iterdir()) == [], "moved into Bob's folder"
    assert broken.read_bytes() == BROKEN and owned(broken) == (alice.uid, alice.gid, 0o600)
    assert error_sidecar(broken) is not None
    refused = events(daemon, "local_quarantine_failed")[0]
    assert str(failed / "alice") in refused["error"] and f"{bob.uid}" in refused["error"], refused
