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
import time
from pathlib import Path

import pytest

from ocrwatch.ledger import Fingerprint
from ocrwatch.safefs import (
    Access,
    FolderGone,
    Replaced,
    Signature,
    TooLarge,
    folder,
    hash_fd,
    read_lease,
    sha256_file,
    walk,
)

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
    with pytest.raises(FolderGone, match="symlink"):
        with walk(tmp_path / "out", ["inbox", "bob", "x"], make=[shared, private, private]):
            pass
    assert list((tmp_path / "trap").iterdir()) == []


def test_a_read_lease_is_refused_while_a_writer_holds_the_file_and_sees_one_that_opens_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(b"%PDF")
    fd = os.open(path, os.O_RDONLY)
    try:
        with open(path, "ab"), pytest.raises(BlockingIOError):
            with read_lease(fd):
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
