"""One source file of an inbox that others can write to, looked at, copied and held: no link is
followed, and a document is read once.

Checking a path and then opening it are two steps that another user can race, by swapping the file
for a symlink between them. So every lookup here walks down from the inbox folder through
``safefs``, the one module that reaches folders others can write to (``O_NOFOLLOW`` on every
component), and every later question is put to the descriptor (``fstat``). A fetched document is
copied through its descriptor into the job's private spool folder while it is hashed: the bytes
rendered are the bytes hashed, whatever happens to the name afterwards. One that admission hashed
(``measure``) under the very signature it is copied under is not hashed again: a document is read
for its sha256 once. The copy costs what the
file holds, not its length: a file over its ``max_bytes`` (by ``fstat``) is never read, and the
holes of a sparse one stay holes. Everything here is blocking and cheap apart from the copy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ocrwatch.errors import FileTooLarge, NotARegularFile, SourceChanged, SourceGone, SourceInUse
from ocrwatch.safefs import (
    FILE_FLAGS,
    Access,
    Folder,
    FolderGone,
    Signature,
    TooLarge,
    copy_fd,
    hash_fd,
    read_lease,
    walk,
)
from ocrwatch.sources.base import Fetched, Read

__all__ = [
    "QUIET_WITHOUT_LEASE",
    "Content",
    "Held",
    "changed_since",
    "copy_out",
    "fetch_copy",
    "folders_of",
    "held",
    "inspect",
    "measure",
    "open_file",
]

QUIET_WITHOUT_LEASE = 60.0
"""Where no lease can be had (NFS, SMB, a daemon that is not root on another user's file), how long
a source must have been unchanged (its mtime and ctime) before it is moved or deleted: a writer that
keeps a file open cannot be seen there, and one that pauses longer than this in the middle of a file
is rare."""


def _relative_parts(path: Path, root: Path) -> tuple[str, ...]:
    if not path.is_relative_to(root) or path == root:
        raise NotARegularFile(f"{path}: outside the inbox {root}")
    parts = path.relative_to(root).parts
    if ".." in parts:
        raise NotARegularFile(f"{path}: outside the inbox {root}")
    return parts


def _symlink_refusal(path: Path, root: Path) -> NotARegularFile:
    """The refusal of a link, saying where it points: its text is only read, never resolved or
    opened."""
    try:
        target = Path(os.path.normpath(path.parent / os.readlink(path)))
    except OSError:  # no longer a link by now
        return NotARegularFile(f"{path}: a symlink; links are not followed")
    where = "leads outside the inbox, to" if not target.is_relative_to(root) else "leads to"
    return NotARegularFile(f"{path}: a symlink that {where} {target}; links are not followed")


@contextlib.contextmanager
def folders_of(path: Path, root: Path) -> Iterator[list[Folder]]:
    """The folders from ``root`` down to ``path``'s, reached through ``safefs`` (no link followed),
    ``root`` first. One on the way that is missing, a link or not a folder: ``SourceGone`` (what the
    name meant when it was found is no longer there)."""
    parts = _relative_parts(path, root)
    with contextlib.ExitStack() as stack:
        try:
            chain = stack.enter_context(walk(root, parts[:-1]))
        except FolderGone as exc:
            where = f"its inbox {root}" if exc.path == root else f"its folder {exc.path}"
            raise SourceGone(f"{path}: {where} {exc.why}") from None
        yield chain


@contextlib.contextmanager
def _folder_of(path: Path, root: Path) -> Iterator[tuple[Folder, int]]:
    """``path``'s folder and the inbox's device."""
    with folders_of(path, root) as chain:
        yield chain[-1], os.fstat(chain[0].fd).st_dev


def _check(path: Path, root: Path, info: os.stat_result, device: int) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise _symlink_refusal(path, root)
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(f"{path}: not a regular file")
    if info.st_dev != device:
        raise NotARegularFile(f"{path}: on another filesystem than its inbox {root}")


def inspect(path: Path, root: Path) -> Signature:
    """The signature of the regular file ``path`` inside ``root`` (resolved). Opens no file.

    Raises ``SourceGone`` when nothing is there (or a folder on the way is no longer a folder), and
    ``NotARegularFile`` for a link, a FIFO, a device or a file on another filesystem.
    """
    with _folder_of(path, root) as (folder, device):
        info = folder.lstat(path.name)
        if info is None:
            raise SourceGone(f"{path}: no longer exists")
        _check(path, root, info, device)
        return Signature.of(info)


def open_file(path: Path, root: Path) -> tuple[int, Signature]:
    """A read-only descriptor of the regular file ``path`` inside ``root``, and its signature by
    ``fstat``. The caller closes it. Raises as ``inspect`` does; nothing but a regular file is ever
    opened."""
    with _folder_of(path, root) as (folder, device):
        try:
            _check(path, root, os.stat(path.name, dir_fd=folder.fd, follow_symlinks=False), device)
            fd = os.open(path.name, FILE_FLAGS, dir_fd=folder.fd)
        except FileNotFoundError:
            raise SourceGone(f"{path}: no longer exists") from None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _symlink_refusal(path, root) from None  # swapped for a link since the check
    try:
        info = os.fstat(fd)
        _check(path, root, info, device)
    except BaseException:
        os.close(fd)
        raise
    return fd, Signature.of(info)


def changed_since(path: Path, root: Path, before: Signature) -> bool:
    """Whether ``path`` no longer is the file that had signature ``before`` (gone, replaced or
    written)."""
    try:
        return not inspect(path, root).unchanged(before)
    except (SourceGone, NotARegularFile, OSError):
        return True


def copy_out(
    fd: int, source: Path, target: Path, max_bytes: int, read: Read | None = None
) -> tuple[str, Signature]:
    """Copy the open file ``fd`` (named ``source`` in messages) to the new file ``target`` (mode
    0600), hashing what is copied; the sha256 of the copy and the signature it was read under. Not
    hashed where ``read`` (admission's hash) was taken under that signature, which holds to the end
    of the copy: its sha256 is the copy's.

    Raises ``FileTooLarge`` over ``max_bytes`` (before copying anything when ``fstat`` says so), and
    ``SourceChanged`` when the file was written while it was copied: the copy could mix two
    versions.
    """
    before = Signature.of(os.fstat(fd))
    if before.size > max_bytes:
        raise FileTooLarge(f"{source}: {before.size} bytes, more than max_bytes={max_bytes}")
    out = os.open(
        target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        try:
            if read is not None and read.holds(before):
                copy_fd(fd, out, limit=max_bytes)
                digest = read.sha256
            else:
                digest = hash_fd(fd, out=out, limit=max_bytes)
        except TooLarge:
            raise FileTooLarge(f"{source}: more than max_bytes={max_bytes} bytes") from None
        after = Signature.of(os.fstat(fd))
        if not after.unchanged(before) or os.fstat(out).st_size != after.size:
            raise SourceChanged(f"{source} changed while it was read")
        # the sidecar reports the source's mtime
        os.utime(out, ns=(os.fstat(fd).st_atime_ns, before.mtime_ns))
    except BaseException:
        os.close(out)
        target.unlink(missing_ok=True)
        raise
    os.close(out)
    return digest, before


def spool_name(path: Path) -> str:
    """A short fixed name for the private copy, keeping a plain suffix for whoever reads the
    folder."""
    suffix = path.suffix
    return "source" + (suffix if re.fullmatch(r"\.\w{1,8}", suffix) else "")


def fetch_copy(
    path: Path, root: Path, spool_dir: Path, max_bytes: int | None, read: Read | None = None
) -> Fetched:
    """The file ``path`` of the inbox ``root``, opened once as ``open_file`` does and copied through
    that descriptor into ``spool_dir``; the copy, its sha256 (``read``'s, where it holds: see
    ``copy_out``), and how to tell later that ``path`` has changed."""
    fd, _ = open_file(path, root)
    target = spool_dir / spool_name(path)
    try:
        info = os.fstat(fd)
        sha256, signature = copy_out(
            fd, path, target, sys.maxsize if max_bytes is None else max_bytes, read
        )
    finally:
        os.close(fd)
    access = Access.of(info)
    return Fetched(target, sha256, partial(changed_since, path, root, signature), access)


def measure(
    path: Path, root: Path, max_bytes: int, stop: threading.Event | None = None
) -> tuple[Signature, str | None]:
    """The signature and sha256 of the file ``path`` of the inbox ``root``, both read through one
    descriptor opened as ``open_file`` does (blocking; hashlib releases the GIL). No sha256 for a
    file over ``max_bytes``: its size comes from ``fstat`` before a byte is read, so a sparse file
    of terabytes costs a ``stat``, and one that grows past it while read is not read further (its
    signature then is the one it has now). ``stop``: as ``hash_fd``'s."""
    fd, signature = open_file(path, root)
    try:
        if signature.size > max_bytes:
            return signature, None
        try:
            return signature, hash_fd(fd, limit=max_bytes, stop=stop)
        except TooLarge:
            return Signature.of(os.fstat(fd)), None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Content:
    """What was read of a source: its size and sha256. ``held`` compares the size (by ``fstat``)
    first, so a file written since, however long it is now, is known changed without a byte read.
    ``read``: admission's hash of it (``Read``), where known: a file that still has the signature
    it was hashed under holds those bytes, and is not read again."""

    size: int
    sha256: str
    read: Read | None = None


@dataclass(frozen=True)
class Held:
    """A source held for a move or a delete: its descriptor, its ``fstat``, and ``check``, which
    raises ``SourceInUse`` once a writer waits to open it (call it right before the name goes)."""

    fd: int
    info: os.stat_result
    check: Callable[[], None]


def _no_writer() -> None:
    return None


@contextlib.contextmanager
def held(
    here: Folder, path: Path, content: Content | None, quiet: float | None = None
) -> Iterator[Held]:
    """The source ``path``, in its open folder ``here``, held while the block moves or deletes it: a
    regular file with one name that no process holds open for writing (a read lease, kept until the
    block ends, makes a writer that opens it meanwhile wait; without leases it must have been quiet
    for ``quiet`` seconds, by default ``QUIET_WITHOUT_LEASE``), whose bytes are still ``content``
    (where known): its size by ``fstat`` before anything else, so a file extended since (a sparse
    terabyte) is refused unread, then its sha256 under the lease, never reading past that size
    (nothing read where it still has the signature ``content.read`` was hashed under). A
    file with another name is kept: moving or deleting one of its names would leave the other with a
    different story. Raises ``SourceGone``, ``SourceChanged`` and ``SourceInUse``."""
    info = here.lstat(path.name)
    if info is None:
        raise SourceGone(f"{path}: no longer exists")
    if stat.S_ISLNK(info.st_mode):
        raise SourceChanged(f"{path}: now a symlink; links are not followed")
    fd = here.open_read(path.name)
    if fd is None:
        raise SourceChanged(f"{path}: no longer a regular file")
    try:
        info = os.fstat(fd)
        if content is not None and info.st_size != content.size:
            said = f"{info.st_size} bytes now, {content.size} when it was read"
            raise SourceChanged(f"{path}: its content is no longer what was read ({said})")
        if info.st_nlink > 1:
            why = f"{path}: has {info.st_nlink} names (hard links); only a file with one is taken"
            raise SourceInUse(why, "hard_linked")
        with contextlib.ExitStack() as stack:
            try:
                writer_waits = stack.enter_context(read_lease(fd))
            except BlockingIOError:
                why = f"{path}: a process holds it open for writing"
                raise SourceInUse(why, "open_for_writing") from None
            quiet = QUIET_WITHOUT_LEASE if quiet is None else quiet
            if writer_waits is None:
                age = time.time() - max(info.st_mtime, info.st_ctime)
                if age < quiet:
                    raise SourceInUse(
                        f"{path}: written {max(age, 0):.0f} s ago, and its filesystem cannot tell "
                        f"whether a writer still holds it open (no lease); it must be quiet for "
                        f"{quiet:.0f} s",
                        "not_quiet",
                        retry_in=quiet - age,
                    )
            if content is not None and not _still(fd, info, content):
                raise SourceChanged(f"{path}: its content is no longer what was read")
            yield Held(fd, info, _writer_check(path, writer_waits))
    finally:
        os.close(fd)


def _still(fd: int, info: os.stat_result, content: Content) -> bool:
    """Whether the open file ``fd`` (of ``info``, its size ``content``'s) still holds ``content``
    and was not written since ``info`` was taken; no more than its size is read, and nothing where
    it still has the signature ``content.read`` was hashed under."""
    read = content.read
    now = Signature.of(os.fstat(fd))
    if read is not None and read.sha256 == content.sha256 and read.holds(now):
        return now.mtime_ns == info.st_mtime_ns
    try:
        digest = hash_fd(fd, limit=content.size)
    except TooLarge:  # grew while read (no lease to keep a writer out)
        return False
    return digest == content.sha256 and os.fstat(fd).st_mtime_ns == info.st_mtime_ns


def _writer_check(path: Path, writer_waits: Callable[[], bool] | None) -> Callable[[], None]:
    if writer_waits is None:
        return _no_writer

    def check() -> None:
        if writer_waits():
            why = f"{path}: a process opened it for writing meanwhile"
            raise SourceInUse(why, "open_for_writing")

    return check
