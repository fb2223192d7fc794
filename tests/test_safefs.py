"""safefs's moves between folders on real files: nothing removed that was not checked, nothing
replaced, owner and mode kept across filesystems, folders made as readable as those they mirror, and
read leases that see a writer (and never end the process that holds them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ocrwatch.errors import UntrustedFolder, path_fault
from ocrwatch.safefs import (
    CHUNK,
    Access,
    FolderGone,
    Replaced,
    Signature,
    Stopped,
    TooLarge,
    folder,
    hash_fd,
    read_lease,
    sha256_file,
    walk,
)
from ocrwatch.safefs import base as safefs_base
from ocrwatch.store.ledger import Fingerprint
from tests.support.sparse import TIB, Reads, sparse_file

OTHER_UID = 54321


def test_remove_if_puts_back_a_file_swapped_in_after_the_check(tmp_path: Path) -> None:
    (tmp_path / "doc.pdf").write_bytes(b"checked")
    checked = os.stat(tmp_path / "doc.pdf")
    os.rename(tmp_path / "doc.pdf", tmp_path / "old.pdf")
    (tmp_path / "doc.pdf").write_bytes(b"someone else's")
    with folder(tmp_path) as here:
        with pytest.raises(Replaced):
            here.remove_if("doc.pdf", checked)
        assert (tmp_path / "doc.pdf").read_bytes() == b"someone else's"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.pdf", "old.pdf"], (
            "nothing left aside"
        )

        def refuse() -> None:
            raise RuntimeError("a writer waits")

        with pytest.raises(RuntimeError):
            here.remove_if("old.pdf", checked, refuse)
        assert (tmp_path / "old.pdf").read_bytes() == b"checked"
        here.remove_if("old.pdf", checked)
        with pytest.raises(Replaced):
            here.remove_if("old.pdf", checked)
    assert [p.name for p in tmp_path.iterdir()] == ["doc.pdf"]


def test_carry_never_replaces_and_never_takes_a_swapped_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "doc.pdf").write_bytes(b"mine")
    (tmp_path / "b" / "taken.pdf").write_bytes(b"theirs")
    with folder(tmp_path, ["a"]) as source, folder(tmp_path, ["b"]) as target:
        fd = source.open_read("doc.pdf")
        assert fd is not None
        info = os.fstat(fd)
        with pytest.raises(FileExistsError):
            source.carry("doc.pdf", target, "taken.pdf", fd, info)
        os.rename(tmp_path / "a" / "doc.pdf", tmp_path / "a" / "kept.pdf")
        (tmp_path / "a" / "doc.pdf").write_bytes(b"swapped in")
        with pytest.raises(Replaced):
            source.move_to("doc.pdf", target, "doc.pdf", fd, info, None)
        assert (
            not (tmp_path / "b" / "doc.pdf").exists()
            and (tmp_path / "a" / "doc.pdf").read_bytes() == b"swapped in"
        )
        os.close(fd)
    assert (tmp_path / "b" / "taken.pdf").read_bytes() == b"theirs"


def test_copy_in_keeps_owner_mode_and_times_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev or os.geteuid() != 0:
        pytest.skip("needs root and /dev/shm on another filesystem than the temporary folder")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        source = tmp_path / "doc.pdf"
        source.write_bytes(b"private text")
        os.chown(source, OTHER_UID, OTHER_UID)
        source.chmod(0o640)
        os.utime(source, ns=(2_000_000_000, 1_000_000_000))
        with folder(tmp_path) as here, folder(other) as there:
            fd = here.open_read("doc.pdf")
            assert fd is not None
            made = here.move_to("doc.pdf", there, "doc.pdf", fd, os.fstat(fd), None)
            os.close(fd)
        assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (
            OTHER_UID,
            OTHER_UID,
            0o640,
        )
        assert (
            made.st_mtime_ns == 1_000_000_000
            and (other / "doc.pdf").read_bytes() == b"private text"
        )
        assert not source.exists()
    finally:
        shutil.rmtree(other)


def test_commit_without_replace_refuses_a_taken_name(tmp_path: Path) -> None:
    (tmp_path / "x.md").write_bytes(b"a user's")
    with folder(tmp_path) as here:
        staged = here.stage("x.md", b"ocrwatch's", Access(0o600, os.geteuid(), os.getegid()))
        with pytest.raises(FileExistsError):
            here.commit(staged, replace=False)
        here.commit(
            here.stage("y.md", b"new", Access(0o600, os.geteuid(), os.getegid())), replace=False
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.md", "y.md"]
    assert (tmp_path / "x.md").read_bytes() == b"a user's"


def test_walk_makes_each_folder_as_readable_as_the_one_it_mirrors_and_follows_no_link(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "trap").mkdir()
    shared, private = Access(0o1777, 0, 0), Access(0o700, OTHER_UID, OTHER_UID)
    with walk(tmp_path / "out", ["inbox", "alice"], make=[shared, private]) as chain:
        assert [f.path.name for f in chain] == ["out", "inbox", "alice"]
    # no write for others, no sticky
    assert stat.S_IMODE((tmp_path / "out" / "inbox").stat().st_mode) == 0o755
    alice = (tmp_path / "out" / "inbox" / "alice").stat()
    if os.geteuid() == 0:
        assert (alice.st_uid, stat.S_IMODE(alice.st_mode)) == (OTHER_UID, 0o700)
    (tmp_path / "out" / "inbox" / "bob").symlink_to(tmp_path / "trap")
    with (
        pytest.raises(FolderGone, match="symlink"),
        walk(tmp_path / "out", ["inbox", "bob", "x"], make=[shared, private, private]),
    ):
        pass
    assert list((tmp_path / "trap").iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "mode", "umask", "made"),
    [
        ("folder", 0o1777, 0o022, 0o755),  # a sticky shared inbox: never writable by others
        ("folder", 0o1777, 0o000, 0o755),  # nor where the umask would let it be
        ("folder", 0o2775, 0o002, 0o755),  # a group's folder: no set-id bit, no group write
        ("folder", 0o711, 0o022, 0o711),  # enterable, not listable: so is its mirror
        ("folder", 0o750, 0o022, 0o750),
        ("folder", 0o755, 0o027, 0o750),  # the umask takes its share
        ("folder", 0o500, 0o022, 0o700),  # the owner's own always
        ("file", 0o664, 0o002, 0o755),  # a figures' folder: its source's readers list and enter
        ("file", 0o640, 0o022, 0o750),
        ("file", 0o600, 0o000, 0o700),
    ],
)
def test_the_mode_of_a_folder_made_to_stand_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, mode: int, umask: int, made: int
) -> None:
    """A folder's own bits less write for group and others, less the umask, the owner's rwx kept;
    for a file, list and enter where it may be read."""
    monkeypatch.setattr(safefs_base, "UMASK", umask)
    thing = tmp_path / "thing"
    if kind == "folder":
        thing.mkdir()
    else:
        thing.write_bytes(b"")
    thing.chmod(mode)
    access = Access.of(os.stat(thing))
    assert access.of_folder == (kind == "folder")
    assert access.folder_mode() == made
    with folder(tmp_path) as here, here.sub("mirror", make=access) as mirror:
        assert stat.S_IMODE(os.fstat(mirror.fd).st_mode) == made


def test_a_folder_found_is_written_through_only_while_it_is_as_ocrwatch_makes_it(
    tmp_path: Path,
) -> None:
    """An existing folder standing for another is used while it has the owner, group and mode a
    made one gets; any difference (another owner, a wider or narrower mode, another group) is
    ``untrusted_folder``, naming the folder, what it is and what it should be, and nothing is made
    or written below it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give folders to other users")
    out = tmp_path / "out"
    out.mkdir()
    shared = Access(0o1777, 0, 0, of_folder=True)
    private = Access(0o700, OTHER_UID, OTHER_UID, of_folder=True)
    note = Access(0o600, OTHER_UID, OTHER_UID)
    with walk(out, ["inbox", "alice"], make=[shared, private]) as chain:
        chain[-1].write("made.md", b"first", note)
    alice = out / "inbox" / "alice"
    info = alice.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (OTHER_UID, OTHER_UID, 0o700)
    with walk(out, ["inbox", "alice"], make=[shared, private]) as chain:  # as made: used
        chain[-1].write("again.md", b"second", note)
    for change, found in (
        (lambda: os.chown(alice, 0, 0), "owned by user 0 (root), group 0 (root) with mode 0700"),
        (lambda: os.chown(alice, OTHER_UID + 1, OTHER_UID), f"user {OTHER_UID + 1},"),
        (lambda: os.chown(alice, OTHER_UID, 0), "group 0 (root) with mode 0700"),
        (lambda: alice.chmod(0o755), "with mode 0755"),
        (lambda: alice.chmod(0o750), "with mode 0750"),
    ):
        change()
        with (
            pytest.raises(UntrustedFolder) as caught,
            walk(out, ["inbox", "alice", "sub"], make=[shared, private, private]) as chain,
        ):
            chain[-1].write("never.md", b"x", note)
        error = caught.value
        assert error.kind == "untrusted_folder" and path_fault(error.kind)
        assert str(alice) in error.message and found in error.message, error.message
        assert f"user {OTHER_UID}, group {OTHER_UID} with mode 0700" in error.message
        assert str(alice) in error.hint and "chown" in error.hint and "move it away" in error.hint
        assert sorted(p.name for p in alice.iterdir()) == ["again.md", "made.md"]
        os.chown(alice, OTHER_UID, OTHER_UID)
        alice.chmod(0o700)
    # a level above: Bob's folder where the shared inbox's mirror goes; nothing is made in it
    os.rename(out / "inbox", tmp_path / "old")
    (out / "inbox").mkdir(mode=0o777)
    os.chown(out / "inbox", OTHER_UID + 1, OTHER_UID + 1)
    (out / "inbox").chmod(0o777)
    with (
        pytest.raises(UntrustedFolder, match="with mode 0777"),
        walk(out, ["inbox", "alice"], make=[shared, private]),
    ):
        pass
    assert list((out / "inbox").iterdir()) == []


def test_a_figures_folder_found_is_as_its_source_or_refused(tmp_path: Path) -> None:
    """A folder made for one document's files gets its source's readers; another user's folder at
    its name is refused, and nothing is written in it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give folders to other users")
    source = Access(0o640, OTHER_UID, OTHER_UID)
    with folder(tmp_path) as here, here.sub("doc.pdf.assets", make=source):
        pass
    made = (tmp_path / "doc.pdf.assets").stat()
    assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (OTHER_UID, OTHER_UID, 0o750)
    (tmp_path / "squat.pdf.assets").mkdir()
    os.chown(tmp_path / "squat.pdf.assets", OTHER_UID + 1, OTHER_UID + 1)
    with (
        folder(tmp_path) as here,
        pytest.raises(UntrustedFolder, match="squat.pdf.assets"),
        here.sub("squat.pdf.assets", make=source) as inner,
    ):
        inner.write("page-1-figure-1.png", b"figure", source)
    assert list((tmp_path / "squat.pdf.assets").iterdir()) == []


def test_a_folder_another_thread_is_making_is_never_taken_half_made(tmp_path: Path) -> None:
    """Two documents of one new folder, written at once: the second never sees the folder between
    its ``mkdir`` (private, the daemon's) and its access being set, which would be refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give folders to other users")
    started, second_done = threading.Event(), threading.Event()

    class Slow(Access):
        def apply(self, fd: int, folder: bool = False) -> None:
            started.set()
            second_done.wait(0.5)  # the second thread gets its chance, or is held back meanwhile
            super().apply(fd, folder)

    private = (0o700, OTHER_UID, OTHER_UID, True)
    outcome: list[BaseException | None] = []

    def second() -> None:
        started.wait(10)
        try:
            with folder(tmp_path) as here, here.sub("alice", make=Access(*private)):
                outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    with folder(tmp_path) as here, here.sub("alice", make=Slow(*private)):
        pass
    thread.join(10)
    assert outcome == [None]


def test_a_read_lease_is_refused_while_a_writer_holds_the_file_and_sees_one_that_opens_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(b"%PDF")
    fd = os.open(path, os.O_RDONLY)
    try:
        with open(path, "ab"), pytest.raises(BlockingIOError), read_lease(fd):
            pass
        with read_lease(fd) as writer_waits:
            assert writer_waits is not None and not writer_waits()
            writer = subprocess.Popen(
                [sys.executable, "-c", f"open({str(path)!r}, 'ab').write(b'more')"]
            )
            deadline = time.monotonic() + 10
            while not writer_waits() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert writer_waits(), "the writer's open breaks the lease"
            assert writer.poll() is None, "and waits for it to go"
        assert writer.wait(10) == 0
    finally:
        os.close(fd)
    # and this process was not ended by the lease's break signal
    assert path.read_bytes() == b"%PDFmore"


def test_one_read_loop_hashes_copies_and_stops_at_its_limit(tmp_path: Path) -> None:
    """``hash_fd`` is every sha256 read: a file hashed, hashed while copied, or refused past a
    limit."""
    content = os.urandom(3 << 20) + b"tail"
    (tmp_path / "doc.pdf").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    assert sha256_file(tmp_path / "doc.pdf") == digest
    fd = os.open(tmp_path / "doc.pdf", os.O_RDONLY)
    out = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        assert hash_fd(fd, out=out, limit=len(content)) == digest
        with pytest.raises(TooLarge):
            hash_fd(fd, limit=len(content) - 1)
    finally:
        os.close(fd)
        os.close(out)
    assert (tmp_path / "copy").read_bytes() == content


def test_a_copy_of_a_sparse_file_takes_no_more_space_than_its_data(tmp_path: Path) -> None:
    """The spool copy of a 64 MiB file holding 64 kB of data: its holes stay holes, so a few
    kilobytes of a user's quota never become a full ``state_dir``."""
    head, tail = os.urandom(40_000), os.urandom(24_000)
    source = sparse_file(tmp_path / "scan.png", 64 << 20, head, tail)
    fd = os.open(source, os.O_RDONLY)
    out = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        digest = hash_fd(fd, out=out)
    finally:
        os.close(fd)
        os.close(out)
    copy = os.stat(tmp_path / "copy")
    assert digest == sha256_file(source) == sha256_file(tmp_path / "copy")
    assert copy.st_size == 64 << 20
    assert copy.st_blocks * 512 <= 1 << 20, f"{copy.st_blocks * 512} bytes on disk for 64 kB"


def test_a_stop_ends_the_read_loop_before_its_next_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sparse terabyte within its limit: a stop, once asked, ends the hash within one block."""
    reads = Reads(monkeypatch, cap=256 << 20)
    huge = reads.watch(sparse_file(tmp_path / "huge.pdf", TIB))
    stop = threading.Event()
    reads.after(8 * CHUNK, stop.set)  # as the daemon's loop sets it, from another thread

    fd = os.open(huge, os.O_RDONLY)
    try:
        with pytest.raises(Stopped):
            hash_fd(fd, limit=2 * TIB, stop=stop)
    finally:
        os.close(fd)
    assert reads.bytes == 8 * CHUNK, "not a block hashed once the stop was set"


def test_the_unchanged_rule_sees_a_replacement_that_keeps_size_and_times(tmp_path: Path) -> None:
    """One rule for "unchanged" where four copies used to differ (the device, the ctime across a
    rename, a record without inode and ctime): a file swapped for one with the same size and mtime
    is changed; a rename is unchanged only where the caller renamed it; an older record matches
    nothing."""
    path = tmp_path / "doc.pdf"
    path.write_bytes(b"first")
    then = Signature.of(os.stat(path))
    assert Signature.of(os.stat(path)).unchanged(then)
    swap = tmp_path / "swap"
    swap.write_bytes(b"other")
    os.utime(swap, ns=(then.mtime_ns, then.mtime_ns))  # touch -r
    os.replace(swap, path)
    assert not Signature.of(os.stat(path)).unchanged(then)
    then = Signature.of(os.stat(path))
    time.sleep(0.05)
    os.rename(path, tmp_path / "aside")
    moved = Signature.of(os.stat(tmp_path / "aside"))
    assert moved.ctime_ns != then.ctime_ns and not moved.unchanged(then)  # a rename sets the ctime
    assert moved.unchanged(then, renamed=True)
    assert not moved.unchanged(None)
    recorded = Fingerprint(size=then.size, mtime_ns=then.mtime_ns, sha256=None)  # an older row
    assert recorded.stat(then.device) is None and not then.unchanged(recorded.stat(then.device))
    full = Fingerprint(then.size, then.mtime_ns, None, inode=then.inode, ctime_ns=then.ctime_ns)
    assert then.unchanged(full.stat(then.device))
