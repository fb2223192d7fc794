"""``sources.sourcefile`` and the fetch of local files on real folders: no link followed, one
descriptor, one copy."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocrwatch.errors import FileTooLarge, NotARegularFile, SourceChanged, SourceGone
from ocrwatch.safefs import CHUNK, Signature
from ocrwatch.sources import sourcefile
from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.sources.files import GivenFiles
from ocrwatch.sources.sourcefile import (
    Content,
    copy_out,
    fetch_copy,
    folders_of,
    held,
    inspect,
    measure,
    open_file,
)
from ocrwatch.store.ledger import Fingerprint, Ledger
from tests.support.sparse import TIB, Reads, sparse_file

RENAME_EXCHANGE = 2
AT_FDCWD = -100


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "inbox"
    (folder / "sub").mkdir(parents=True)
    return folder


def test_inspect_takes_regular_files_and_refuses_links_fifos_and_paths_through_links(
    root: Path, tmp_path: Path
) -> None:
    (root / "sub" / "doc.pdf").write_bytes(b"%PDF-1.7 body")
    info = os.stat(root / "sub" / "doc.pdf")
    assert inspect(root / "sub" / "doc.pdf", root) == Signature.of(info)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "doc.pdf").write_bytes(b"outside")
    (root / "out").symlink_to(tmp_path / "outside")
    (root / "alias.pdf").symlink_to("sub/doc.pdf")
    (root / "escape.pdf").symlink_to(tmp_path / "outside" / "doc.pdf")
    os.mkfifo(root / "pipe.pdf")

    with pytest.raises(SourceGone, match="is a symlink; links are not followed"):
        inspect(root / "out" / "doc.pdf", root)
    with pytest.raises(NotARegularFile, match="leads to .*links are not followed"):
        inspect(root / "alias.pdf", root)
    with pytest.raises(NotARegularFile, match="leads outside the inbox"):
        inspect(root / "escape.pdf", root)
    with pytest.raises(NotARegularFile, match="not a regular file"):
        inspect(root / "pipe.pdf", root)
    with pytest.raises(SourceGone):
        inspect(root / "missing.pdf", root)
    with pytest.raises(SourceGone):
        inspect(root / "sub" / "doc.pdf" / "x.pdf", root)  # a file where a folder should be
    with pytest.raises(NotARegularFile, match="outside the inbox"):
        inspect(tmp_path / "outside" / "doc.pdf", root)
    with pytest.raises(NotARegularFile, match="outside the inbox"):
        inspect(root / ".." / "outside" / "doc.pdf", root)


def test_open_file_never_blocks_on_a_fifo_and_never_opens_a_link(root: Path) -> None:
    os.mkfifo(root / "pipe.pdf")
    (root / "doc.pdf").write_bytes(b"data")
    (root / "link.pdf").symlink_to("doc.pdf")
    for name in ("pipe.pdf", "link.pdf"):
        with pytest.raises(NotARegularFile):
            open_file(root / name, root)
    fd, signature = open_file(root / "doc.pdf", root)
    try:
        assert os.read(fd, 10) == b"data" and signature.size == 4
    finally:
        os.close(fd)
    assert measure(root / "doc.pdf", root, 4) == (signature, hashlib.sha256(b"data").hexdigest())


def test_a_file_over_its_budget_is_measured_unread_even_when_it_grows_past_it_while_read(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over ``max_bytes`` by ``fstat``: no sha256 and no byte read. Within it when opened, then
    written past it while hashed: no sha256 either, and the signature it has now."""
    huge = sparse_file(root / "huge.pdf", 2 * TIB)
    reads = Reads(monkeypatch, cap=0)
    reads.watch(huge)
    assert measure(huge, root, 1 << 20) == (Signature.of(os.stat(huge)), None)
    assert reads.bytes == 0

    growing = root / "growing.pdf"
    growing.write_bytes(b"%PDF-1.4\n" + bytes(1000))
    real_pread = os.pread

    def written_meanwhile(fd: int, length: int, offset: int) -> bytes:
        if offset == 0:  # a writer appends as the hash begins
            with open(growing, "ab") as handle:
                handle.write(os.urandom(3 << 20))
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", written_meanwhile)
    signature, digest = measure(growing, root, 1 << 20)
    assert digest is None and signature == Signature.of(os.stat(growing))
    assert signature.size > 1 << 20


def test_a_held_file_is_measured_by_its_size_before_a_byte_is_read_and_never_read_past_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``held`` is given what was read (size and sha256): a file of another size now, such as a
    done file extended since to a sparse 2 TiB, is ``SourceChanged`` without a byte read. One of the
    size read is hashed, to that size; other bytes of that size are refused; one written past it
    while hashed (no lease kept its writer out) is refused with no more than a block read past."""
    size = 4 * CHUNK
    doc = sparse_file(root / "sub" / "doc.pdf", size)
    content = Content(size, hashlib.sha256(doc.read_bytes()).hexdigest())
    reads = Reads(monkeypatch)
    reads.watch(doc)

    def hold() -> int:
        with folders_of(doc, root) as folders, held(folders[-1], doc, content, 0) as source:
            return source.info.st_size

    assert hold() == size and reads.bytes == size
    os.truncate(doc, 2 * TIB)
    with pytest.raises(SourceChanged, match=f"{2 * TIB} bytes now, {size} when it was read"):
        hold()
    assert reads.bytes == size, "read after the size told it changed"

    os.truncate(doc, size)
    with open(doc, "r+b") as handle:
        handle.write(b"%PDF-1.7")  # other bytes, the same size
    with pytest.raises(SourceChanged):
        hold()
    assert reads.bytes == 2 * size

    content = Content(size, hashlib.sha256(doc.read_bytes()).hexdigest())

    @contextlib.contextmanager
    def no_lease(fd: int) -> Iterator[None]:
        yield None  # NFS, SMB: a writer cannot be kept out

    def appended() -> None:
        with open(doc, "ab") as handle:
            handle.write(os.urandom(4 * CHUNK))

    monkeypatch.setattr(sourcefile, "read_lease", no_lease)
    reads.after(2 * size + 1, appended)
    with pytest.raises(SourceChanged):
        hold()
    assert 2 * size < reads.bytes <= 3 * size + CHUNK


def test_fetch_copies_privately_keeps_mtime_and_tells_a_replacement_with_the_same_size_and_mtime(
    root: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    source = root / "sub" / "scan.pdf"
    source.write_bytes(b"%PDF first version")
    before = source.stat()
    fetched = fetch_copy(source, root, spool, 1000)
    assert fetched.path.parent == spool and fetched.path.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(fetched.path.stat().st_mode) == 0o600
    assert fetched.path.stat().st_mtime_ns == before.st_mtime_ns
    assert fetched.sha256 == hashlib.sha256(b"%PDF first version").hexdigest()
    assert not fetched.changed()

    with open(source, "r+b") as handle:  # rewritten in place: same inode, same size, mtime put back
        handle.write(b"%PDF other version")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (source.stat().st_size, source.stat().st_mtime_ns) == (
        before.st_size,
        before.st_mtime_ns,
    )
    assert fetched.changed(), "ctime tells the rewrite"

    fetched.path.unlink()
    fetched = fetch_copy(source, root, spool, 1000)
    replacement = root / "sub" / ".new"
    replacement.write_bytes(b"%PDF third version")
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.rename(replacement, source)
    assert fetched.changed(), "the inode tells the replacement"

    fetched.path.unlink()
    with pytest.raises(FileTooLarge):
        fetch_copy(source, root, spool, 10)
    assert list(spool.iterdir()) == [], "refused before anything was copied"


def test_a_file_written_while_it_is_copied_is_refused_as_changed(
    root: Path, tmp_path: Path
) -> None:
    source = root / "growing.pdf"
    with open(source, "wb") as handle:
        handle.truncate(256 << 20)  # sparse: reading it takes a while, writing it nothing
    stop = threading.Event()

    def append() -> None:
        with open(source, "ab") as handle:
            while not stop.is_set():
                handle.write(b"x")
                handle.flush()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        fd, _ = open_file(source, root)
        with pytest.raises(SourceChanged):
            copy_out(fd, source, tmp_path / "copy", 1 << 40)
        os.close(fd)
    finally:
        stop.set()
        writer.join()
    assert not (tmp_path / "copy").exists()


def test_fetch_under_a_swap_race_only_ever_copies_the_inbox_file(
    root: Path, tmp_path: Path
) -> None:
    """``renameat2(RENAME_EXCHANGE)`` swaps the document with a link to a private file, as fast as
    it can, while the document is fetched again and again: every fetch either copies the inbox's own
    bytes or refuses."""
    secret = tmp_path / "secret.pdf"
    secret.write_bytes(b"%PDF secret bytes")
    secret.chmod(0o600)
    document = root / "swap.pdf"
    document.write_bytes(b"%PDF public bytes")
    (root / ".h").mkdir()
    (root / ".h" / "swap.pdf").symlink_to(secret)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    stop = threading.Event()

    def race() -> None:
        a, b = os.fsencode(document), os.fsencode(root / ".h" / "swap.pdf")
        while not stop.is_set():
            assert libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0

    racer = threading.Thread(target=race)
    racer.start()
    outcomes: dict[str, int] = {"copied": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            spool = Path(os.path.join(tmp_path, f"spool-{sum(outcomes.values())}"))
            spool.mkdir()
            try:
                fetched = fetch_copy(document, root, spool, 1 << 20)
            except (NotARegularFile, SourceGone, SourceChanged):
                outcomes["refused"] += 1
                continue
            assert fetched.path.read_bytes() == b"%PDF public bytes"
            assert fetched.sha256 == hashlib.sha256(b"%PDF public bytes").hexdigest()
            outcomes["copied"] += 1
    finally:
        stop.set()
        racer.join()
    assert outcomes["copied"] and outcomes["refused"], outcomes


def test_given_files_follow_the_link_the_user_named_and_copy_through_one_descriptor(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real.png"
    real.write_bytes(b"\x89PNG\r\n\x1a\n bytes")
    (tmp_path / "named.png").symlink_to(real)
    os.mkfifo(tmp_path / "pipe.png")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    source = GivenFiles(
        [tmp_path / "named.png", tmp_path / "pipe.png", tmp_path / "sub" / ".." / "gone.png"]
    )
    named, pipe, gone = source.jobs()
    assert named.origin == LocalFile(tmp_path / "named.png", tmp_path)
    assert gone.origin.uri == (tmp_path / "gone.png").as_uri()

    async def scenario() -> None:
        fetched = await source.fetch(named, spool)
        assert fetched.path.read_bytes() == real.read_bytes()
        assert (
            fetched.sha256 == hashlib.sha256(real.read_bytes()).hexdigest()
            and not fetched.changed()
        )
        with pytest.raises(NotARegularFile):
            await source.fetch(pipe, spool)  # returns at once: opened non-blocking
        with pytest.raises(SourceGone):
            await source.fetch(gone, spool)
        with pytest.raises(FileTooLarge):
            await source.fetch(Job(named.origin, "cli", max_bytes=3), spool)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_job_key_does_not_move_when_a_link_appears_on_its_path(
    root: Path, tmp_path: Path
) -> None:
    job = Job(origin=LocalFile(root / "sub" / "doc.pdf", root), source="local")
    key = job.key
    os.rename(root / "sub", tmp_path / "moved")
    (root / "sub").symlink_to(tmp_path / "moved")
    assert job.key == key == (root / "sub" / "doc.pdf").as_uri()


def test_the_ledger_keeps_inode_and_ctime_and_restarts_a_job_failed_for_what_its_path_was(
    tmp_path: Path,
) -> None:
    job = Job(origin=LocalFile(tmp_path / "in" / "doc.pdf", tmp_path / "in"), source="local")
    first = Fingerprint(size=10, mtime_ns=5, sha256="a" * 64, inode=42, ctime_ns=7)
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as ledger:
        assert ledger.admit(job, first)
        assert ledger.known(job.key).fingerprint == first
        ledger.mark_failed(job.key, NotARegularFile("a symlink").as_dict())
        seen_again = Fingerprint(size=10, mtime_ns=5, sha256="a" * 64, inode=43, ctime_ns=9)
        assert ledger.admit(job, seen_again), (
            "failed for what the path was: taken again once it is a file"
        )
        assert ledger.known(job.key).fingerprint == seen_again
        ledger.mark_failed(
            job.key, {"kind": "corrupt_pdf", "message": "bad", "retryable": False, "hint": ""}
        )
        assert not ledger.admit(job, seen_again), "a fault of the document stays failed"
