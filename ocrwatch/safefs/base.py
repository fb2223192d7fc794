"""The safe filesystem's parts that need no open folder: flags, names, signatures, access,
hashing."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Non-blocking, so a FIFO swapped in after a type check cannot hang the thread that opens it."""
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
HOLE = 1 << 16
"""A copy skips a run of this many zero bytes (aligned in the file), leaving a hole: the spool copy
of a sparse file takes no more space than the file's data."""
_ZEROS = bytes(HOLE)
GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
"""What opening a folder on the way raises when it is missing, a link or not a folder."""
TMP_MARKER = ".ocrwatch-tmp-"
ASIDE_MARKER = ".ocrwatch-gone-"
"""Marks the hidden name a file takes right before its removal: what goes is what was checked."""
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""``link`` cannot join two names (another filesystem, or one without hard links): it is copied."""
NO_LEASE = (
    errno.EINVAL,
    errno.ENOTSUP,
    errno.EOPNOTSUPP,
    errno.ENOLCK,
    errno.ENOSYS,
    errno.EACCES,
    errno.EPERM,
)
"""A lease refused for the filesystem (NFS, SMB, FUSE) or the daemon's rights, not for a writer."""
LEASE_SIGNAL = signal.SIGURG
"""Sent to a lease's holder when a writer opens the file: the default, SIGIO, would end the process;
SIGURG's default action is to ignore it (``read_lease`` asks the kernel itself whether its lease is
being broken)."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _umask()
"""The process's umask (the unit's ``UMask``), read once at import: ``os.umask`` cannot be read
alone."""


class Signature(NamedTuple):
    """What "unchanged" means for a file. Size and mtime alone miss a replacement that keeps both
    (``touch -r``, a copy preserving times); the inode and ctime cannot be set back by a user."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, info: os.stat_result) -> Signature:
        return cls(info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)

    def unchanged(self, then: Signature | None, *, renamed: bool = False) -> bool:
        """The one rule for "the file is unchanged since ``then``" (None: nothing recorded, so
        not). ``renamed``: renamed or linked since, which changes only the ctime."""
        if then is None:
            return False
        if renamed:
            return self._replace(ctime_ns=then.ctime_ns) == then
        return self == then


class Replaced(OSError):
    """A name no longer holds the file that was checked (another, or none): it was left as it is."""


class FolderGone(OSError):
    """A folder on the way is missing, a link or not a folder: what the name meant is no longer
    there."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(errno.ENOENT, f"{path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True)
class Access:
    """Who may read a file or folder: its mode bits and owner. An output is given its source's, so
    it is never readable by more people than the source (the source's read and write bits, less the
    umask); a folder made to stand for an inbox folder is given that folder's (``of_folder``)."""

    mode: int
    uid: int
    gid: int
    of_folder: bool = False
    """A folder's: one made for it keeps its own bits, where a file's readers get list and enter."""

    @classmethod
    def of(cls, info: os.stat_result) -> Access:
        mode = stat.S_IMODE(info.st_mode)
        return cls(mode, info.st_uid, info.st_gid, stat.S_ISDIR(info.st_mode))

    def file_mode(self) -> int:
        return self.mode & 0o666 & ~UMASK

    def folder_mode(self) -> int:
        """The mode of a folder made with this access: a folder's own bits (a 0711 folder stays
        enterable, not listable), or a file's readers may list and enter it; less the umask, never
        writable by group or others (a sticky 1777 inbox is mirrored 0755), always the owner's."""
        if self.of_folder:
            mode = self.mode & ~UMASK
        else:
            mode = self.file_mode()
            mode |= (mode & 0o444) >> 2
        return (mode & 0o755) | 0o700

    def apply(self, fd: int, folder: bool = False) -> None:
        """Set the owner (where the daemon may: root) and then the mode on the open file ``fd``."""
        if os.geteuid() == 0:
            os.fchown(fd, self.uid, self.gid)
        os.fchmod(fd, self.folder_mode() if folder else self.file_mode())

    def made_as(self, info: os.stat_result) -> bool:
        """Whether the folder of ``info`` is as ``apply`` makes one: its owner and group (root's
        daemon sets them; any other owns what it makes, in the group the filesystem gives) and its
        permission bits ``folder_mode``."""
        if (info.st_mode & 0o777) != self.folder_mode():
            return False
        if os.geteuid() == 0:
            return (info.st_uid, info.st_gid) == (self.uid, self.gid)
        return info.st_uid == os.geteuid()


PUBLIC = Access(0o644, os.geteuid(), os.getegid())
"""For outputs of no local source (``ocrwatch ocr`` of a stream, an error of a vanished file): the
daemon's."""


@dataclass(frozen=True)
class Occupant:
    """What lies at a name: a regular file (its ``stat`` and first bytes), or what it is instead."""

    path: Path
    other: str | None = None  # "a folder", "a FIFO", ... for anything but a regular file
    head: bytes = b""
    info: os.stat_result | None = None


def describe(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def parts_below(path: Path, root: Path) -> tuple[str, ...]:
    """The components of ``path`` below ``root``, both absolute; ``ValueError`` outside it."""
    parts = path.relative_to(root).parts
    if ".." in parts:
        raise ValueError(f"{path} is outside {root}")
    return parts


def temporary_name(name: str) -> str:
    """The hidden name ``name`` is written under before the rename: fixed per target, at most 108
    bytes."""
    raw = os.fsencode(name)
    tag = hashlib.sha1(raw).hexdigest()[:12]
    return os.fsdecode(b"." + raw[:80]) + TMP_MARKER + tag


def read_head(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of the open file ``fd``."""
    chunks: list[bytes] = []
    offset = 0
    while offset < limit and (chunk := os.pread(fd, limit - offset, offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def hash_fd(
    fd: int,
    *,
    out: int | None = None,
    limit: int | None = None,
    stop: threading.Event | None = None,
) -> str:
    """The sha256 of the whole open file ``fd``, read from its start with ``pread`` (hashlib
    releases the GIL): the one read loop, also copying each block to ``out`` (a new, empty file)
    where given. ``TooLarge`` once more than ``limit`` bytes are read, before they are copied;
    ``Stopped`` before the next block once ``stop`` is set, so a stopping daemon never waits for a
    whole file. The copy leaves every run of ``HOLE`` zero bytes a hole: a sparse source's holes,
    read as zeros, never take space where it is copied."""
    hasher = hashlib.sha256()
    _read_whole(fd, hasher.update, out, limit, stop)
    return hasher.hexdigest()


def copy_fd(fd: int, out: int, *, limit: int | None = None) -> None:
    """``hash_fd``'s copy of the open file ``fd`` to ``out`` without its hash: for bytes whose
    sha256 was taken before, under the very signature they are read under now, so a document is
    hashed once (``sources.sourcefile.copy_out``). ``TooLarge`` as ``hash_fd`` raises it."""
    _read_whole(fd, None, out, limit, None)


def _read_whole(
    fd: int,
    take: Callable[[bytes], object] | None,
    out: int | None,
    limit: int | None,
    stop: threading.Event | None,
) -> None:
    """The one read loop: each block of ``fd`` from its start given to ``take`` and copied to
    ``out``, where given."""
    offset = 0
    while block := os.pread(fd, CHUNK, offset):
        if stop is not None and stop.is_set():
            raise Stopped(f"stopped after {offset} bytes")
        if limit is not None and offset + len(block) > limit:
            raise TooLarge(f"more than {limit} bytes")
        if take is not None:
            take(block)
        if out is not None:
            _write_sparse(out, block, offset)
        offset += len(block)
    if out is not None:
        os.ftruncate(out, offset)  # a hole at the end is still the copy's length


def _write_sparse(out: int, block: bytes, offset: int) -> None:
    """``block`` written at ``offset`` of ``out``, each run of ``HOLE`` zero bytes skipped."""
    for start in range(0, len(block), HOLE):
        piece = block[start : start + HOLE]  # a bytes slice: compared by memcmp
        if piece != _ZEROS[: len(piece)]:
            view = memoryview(piece)
            at = offset + start
            while view:
                written = os.pwrite(out, view, at)
                view, at = view[written:], at + written


def sha256_file(path: Path) -> str:
    """The sha256 of a file the daemon made itself (a spool copy, an output), by ``hash_fd``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


class TooLarge(Exception):
    """``hash_fd`` read more than its limit."""


class Stopped(Exception):
    """``hash_fd`` was told to stop (the daemon is stopping): what it read is of no use."""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def read_lease(fd: int) -> Iterator[Callable[[], bool] | None]:
    """A read lease on the open file ``fd`` while the block runs. The kernel grants one only while
    no process holds the file open for writing (``BlockingIOError`` otherwise), and a writer that
    opens it meanwhile waits until it is released (at most ``/proc/sys/fs/lease-break-time``).
    Yields "is a writer waiting?", or None where no lease can be had (``NO_LEASE``: NFS, SMB, a file
    of another user for a daemon that is not root)."""
    fcntl.fcntl(fd, fcntl.F_SETSIG, LEASE_SIGNAL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        if exc.errno not in NO_LEASE:
            raise
        yield None
        return
    try:
        yield lambda: fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
    finally:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def aside_name(name: str) -> str:
    raw = os.fsencode(name)
    return os.fsdecode(b"." + raw[:80]) + ASIDE_MARKER + hashlib.sha1(raw).hexdigest()[:12]
