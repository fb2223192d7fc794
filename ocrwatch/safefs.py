"""Every read, write, move and removal under a folder that others can write to: descriptors all the way down.

A root daemon on a shared inbox must never be turned into one user's tool against another. Checking a path and
then using it are two steps a user can race, by swapping a folder on the way for a symlink between them. So a
folder here is reached from a configured root one component at a time with ``O_NOFOLLOW | O_DIRECTORY``, and
everything done inside it goes through that folder's descriptor (``dir_fd=``): no path is resolved again
after it was checked, and no link is followed, to a file or a folder. Files written get no more readers than
the source they were made from (``Access``), set on the descriptor before the rename makes them visible.
Everything here is blocking.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import signal
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Non-blocking, so a FIFO swapped in after a type check cannot hang the thread that opens it."""
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
"""What opening a folder on the way raises when it is missing, a link or not a folder."""
TMP_MARKER = ".ocrwatch-tmp-"
ASIDE_MARKER = ".ocrwatch-gone-"
"""Marks the hidden name a file takes right before its removal: what goes is what was checked."""
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""``link`` cannot join two names (another filesystem, or one without hard links): it is copied."""
NO_LEASE = (
    errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOLCK, errno.ENOSYS,
    errno.EACCES, errno.EPERM,
)  # fmt: skip
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
"""The process's umask (the unit's ``UMask``), read once at import: ``os.umask`` cannot be read alone."""


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
    """A folder on the way is missing, a link or not a folder: what the name meant is no longer there."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(errno.ENOENT, f"{path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True)
class Access:
    """Who may read a file: its mode bits and owner. An output is given its source's, so it is never readable
    by more people than the source (the source's read and write bits, less the umask)."""

    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, info: os.stat_result) -> Access:
        return cls(stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)

    def file_mode(self) -> int:
        return self.mode & 0o666 & ~UMASK

    def folder_mode(self) -> int:
        """A folder of outputs may be listed by whoever may read them, and entered by them alone."""
        mode = self.file_mode()
        return mode | ((mode & 0o444) >> 2) | 0o700

    def apply(self, fd: int, folder: bool = False) -> None:
        """Set the owner (where the daemon may: root) and then the mode on the open file ``fd``."""
        if os.geteuid() == 0:
            os.fchown(fd, self.uid, self.gid)
        os.fchmod(fd, self.folder_mode() if folder else self.file_mode())


PUBLIC = Access(0o644, os.geteuid(), os.getegid())
"""For outputs of no local source (``ocrwatch ocr`` of a stream, an error of a vanished file): the daemon's."""


@dataclass(frozen=True)
class Occupant:
    """What lies at a name: a regular file (its ``stat`` and first bytes), or what it is instead."""

    path: Path
    other: str | None = None  # "a folder", "a FIFO", ... for anything but a regular file
    head: bytes = b""
    info: os.stat_result | None = None


def describe(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


@dataclass(frozen=True)
class Staged:
    """A file written under its temporary name, not yet renamed over ``name``: what it will be."""

    folder: Folder
    name: str
    tmp: str
    inode: int
    size: int
    sha256: str


class Folder:
    """An open folder reached without following a link; ``path`` names it in messages only, never to act."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def __repr__(self) -> str:
        return f"Folder({self.path})"

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                return None
            raise

    def open_read(self, name: str) -> int | None:
        """A read-only descriptor of the regular file ``name`` (None: nothing there, or not a regular file)."""
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENAMETOOLONG):
                return None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def look(self, name: str, limit: int) -> Occupant | None:
        """What lies at ``name`` (None: nothing, or a name too long to exist), reading at most ``limit``
        bytes. Never follows a link, never blocks on a FIFO, never reads a device: the type is checked with
        ``lstat`` and again with ``fstat`` on a descriptor opened ``O_NOFOLLOW | O_NONBLOCK``."""
        path = self.path / name
        info = self.lstat(name)
        if info is None:
            return None
        if not stat.S_ISREG(info.st_mode):
            return Occupant(path, describe(info.st_mode), info=info)
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except PermissionError:
            return Occupant(path, "a file ocrwatch cannot read", info=info)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return Occupant(path, "a symbolic link", info=info)
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return Occupant(path, describe(info.st_mode), info=info)
            return Occupant(path, None, read_head(fd, limit), info)
        finally:
            os.close(fd)

    def sha256(self, name: str) -> tuple[os.stat_result, str] | None:
        """The ``fstat`` and sha256 of the regular file ``name``, read through one descriptor."""
        fd = self.open_read(name)
        if fd is None:
            return None
        try:
            return os.fstat(fd), hash_fd(fd)
        finally:
            os.close(fd)

    def stage(self, name: str, data: bytes | Path, access: Access) -> Staged:
        """Write ``data`` (bytes, or a file's content) under ``name``'s fixed hidden temporary name (a leftover
        of a killed write is replaced), created exclusively, given ``access`` and fsynced; ``commit`` renames
        it over ``name``. Between the two, the caller may record what it is about to publish."""
        tmp = temporary_name(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)  # unlinking a symlink never touches its target
        fd = os.open(tmp, NEW_FLAGS, 0o600, dir_fd=self.fd)
        try:
            if isinstance(data, Path):
                content = os.open(data, os.O_RDONLY | os.O_CLOEXEC)  # the job's own spool file
                try:
                    digest = hash_fd(content, out=fd)
                finally:
                    os.close(content)
            else:
                digest = hashlib.sha256(data).hexdigest()
                _write_all(fd, data)
            access.apply(fd)
            os.fsync(fd)
            info = os.fstat(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        finally:
            os.close(fd)
        return Staged(self, name, tmp, info.st_ino, info.st_size, digest)

    def commit(self, staged: Staged, *, replace: bool = True) -> None:
        """Rename a staged file over its name, so that the name is always absent, the old file or all of the
        new one; then the folder is fsynced. ``replace=False``: only while the name is free, else
        ``FileExistsError`` (the temporary file goes)."""
        try:
            if replace:
                os.replace(staged.tmp, staged.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            else:
                self._commit_new(staged)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staged.tmp, dir_fd=self.fd)
            raise
        self.fsync()

    def _commit_new(self, staged: Staged) -> None:
        """A hard link fails where the name is taken, atomically; else the name is checked first."""
        try:
            os.link(staged.tmp, staged.name, src_dir_fd=self.fd, dst_dir_fd=self.fd,
                    follow_symlinks=False)  # fmt: skip
        except OSError as exc:
            if exc.errno not in NO_LINK:
                raise
            if self.lstat(staged.name) is not None:
                taken = str(self.path / staged.name)
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), taken) from None
            os.replace(staged.tmp, staged.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            return
        os.unlink(staged.tmp, dir_fd=self.fd)

    def write(self, name: str, data: bytes | Path, access: Access) -> Staged:
        """``stage`` and ``commit`` at once, for a file nothing records."""
        staged = self.stage(name, data, access)
        self.commit(staged)
        return staged

    def unlink(self, name: str) -> bool:
        """Remove the file ``name`` (a link itself, never its target); False where nothing was there."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):
                return False
            raise
        return True

    def link(self, name: str, target: Folder, new: str) -> None:
        """A second name ``new`` in ``target`` for the file ``name`` here (a link itself, never its
        target). ``FileExistsError`` where ``new`` is taken; an ``OSError`` with an errno in
        ``NO_LINK`` where the two folders cannot share a file (the caller copies it instead)."""
        os.link(name, new, src_dir_fd=self.fd, dst_dir_fd=target.fd, follow_symlinks=False)

    def copy_in(self, fd: int, new: str) -> tuple[os.stat_result, str]:
        """The open file ``fd`` copied to the new file ``new`` here (never replacing one), with its
        owner (where the daemon may set it), mode and times, fsynced: a move across filesystems
        leaves the file as its owner had it. Its ``fstat`` and the sha256 of what was copied."""
        info = os.fstat(fd)
        out = os.open(new, NEW_FLAGS, 0o600, dir_fd=self.fd)
        try:
            digest = hash_fd(fd, out=out)
            if os.geteuid() == 0:
                os.fchown(out, info.st_uid, info.st_gid)
            os.fchmod(out, stat.S_IMODE(info.st_mode) & 0o777)  # no set-id bit on a copy root made
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.fsync(out)
            made = os.fstat(out)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(new, dir_fd=self.fd)
            raise
        finally:
            os.close(out)
        return made, digest

    def carry(
        self, name: str, target: Folder, new: str, fd: int, info: os.stat_result
    ) -> os.stat_result:
        """A new name ``new`` in ``target`` for the file ``name`` here, open as ``fd`` (of
        ``info``): a hard link, checked to be that very file, or where the two folders cannot share
        one a copy from ``fd`` (``copy_in``). The new file's ``stat``; ``FileExistsError`` where
        ``new`` is taken, ``Replaced`` where ``name`` no longer held that file (nothing is left at
        ``new`` then)."""
        try:
            self.link(name, target, new)
        except FileNotFoundError:
            raise Replaced(errno.ENOENT, f"{self.path / name} no longer exists") from None
        except OSError as exc:
            if exc.errno not in NO_LINK:
                raise
            return target.copy_in(fd, new)[0]
        made = target.lstat(new)
        if made is None or (made.st_dev, made.st_ino) != (info.st_dev, info.st_ino):
            target.unlink(new)
            raise Replaced(errno.ESTALE, f"{self.path / name} was replaced since it was checked")
        return made

    def move_to(
        self, name: str, target: Folder, new: str, fd: int, info: os.stat_result,
        check: Callable[[], None] | None,
    ) -> os.stat_result:  # fmt: skip
        """Move the file ``name`` here (open as ``fd``, of ``info``) to ``new`` in ``target``:
        ``carry``, then ``remove_if`` (``check`` as there), undoing the new name where the old one
        cannot go."""
        made = self.carry(name, target, new, fd, info)
        try:
            self.remove_if(name, info, check)
        except BaseException:
            target.unlink(new)
            raise
        target.fsync()
        return made

    def remove_if(
        self, name: str, expected: os.stat_result, check: Callable[[], None] | None = None
    ) -> None:
        """Remove ``name`` only while it is the file ``expected`` (same inode, size and mtime). It
        is renamed aside first, one atomic step, and then compared, so a file swapped in after the
        last check is put back, never removed; ``check`` runs before the removal too (raising keeps
        the file). ``Replaced`` where the name holds another file or none."""
        aside = _aside_name(name)
        try:
            os.rename(name, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except FileNotFoundError:
            raise Replaced(errno.ENOENT, f"{self.path / name} no longer exists") from None
        try:
            now = Signature.of(os.stat(aside, dir_fd=self.fd, follow_symlinks=False))
            if not now.unchanged(Signature.of(expected), renamed=True):
                why = f"{self.path / name} was replaced or written since it was checked"
                raise Replaced(errno.ESTALE, why)
            if check is not None:
                check()
        except BaseException:
            self._put_back(aside, name)
            raise
        os.unlink(aside, dir_fd=self.fd)
        self.fsync()

    def _put_back(self, aside: str, name: str) -> None:
        """``aside`` under its own name again, unless another file took that name meanwhile (then it
        stays under the hidden name, which nothing removes)."""
        try:
            os.link(aside, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in NO_LINK or self.lstat(name) is not None:
                raise
            os.rename(aside, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            return
        os.unlink(aside, dir_fd=self.fd)

    def rmdir(self, name: str) -> bool:
        """Remove the folder ``name`` once it is empty; False where it is not (a user's file keeps it)."""
        try:
            os.rmdir(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def fsync(self) -> None:
        os.fsync(self.fd)

    @contextlib.contextmanager
    def sub(self, name: str, make: Access | None = None) -> Iterator[Folder]:
        """The folder ``name`` inside this one, never a link; made with ``make``'s access where missing."""
        path = self.path / name
        if make is not None:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            else:
                fd = os.open(name, FOLDER_FLAGS, dir_fd=self.fd)
                try:
                    make.apply(fd, folder=True)
                except BaseException:
                    os.close(fd)
                    raise
                self.fsync()
                yield from _held(fd, path)
                return
        try:
            fd = os.open(name, FOLDER_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in GONE:
                raise FolderGone(path, _why(self, name)) from None
            raise
        yield from _held(fd, path)


def _held(fd: int, path: Path) -> Iterator[Folder]:
    try:
        yield Folder(fd, path)
    finally:
        os.close(fd)


def _why(parent: Folder, name: str) -> str:
    info = parent.lstat(name)
    if info is None:
        return "no longer exists"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink; links are not followed"
    return "is not a folder"


@contextlib.contextmanager
def folder(root: Path, parts: Sequence[str] = (), make: Access | None = None) -> Iterator[Folder]:
    """The folder ``root/parts...``, reached from ``root`` (a configured folder, resolved at start) one
    component at a time without following a link. With ``make``, each missing folder below ``root`` is made
    (owned and moded by ``make``); else a missing one, a link or a non-folder on the way is ``FolderGone``."""
    try:
        fd = os.open(root, FOLDER_FLAGS)
    except OSError as exc:
        if exc.errno in GONE:
            raise FolderGone(root, "is gone or was replaced by a link") from None
        raise
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        here = Folder(fd, root)
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise FolderGone(here.path / part, "is not a plain folder name")
            here = stack.enter_context(here.sub(part, make))
        yield here


def parts_below(path: Path, root: Path) -> tuple[str, ...]:
    """The components of ``path`` below ``root``, both absolute; ``ValueError`` outside it."""
    parts = path.relative_to(root).parts
    if ".." in parts:
        raise ValueError(f"{path} is outside {root}")
    return parts


def temporary_name(name: str) -> str:
    """The hidden name ``name`` is written under before the rename: fixed per target, at most 108 bytes."""
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


def hash_fd(fd: int, *, out: int | None = None, limit: int | None = None) -> str:
    """The sha256 of the whole open file ``fd``, read from its start with ``pread`` (hashlib
    releases the GIL): the one read loop, also copying each block to ``out`` where given.
    ``TooLarge`` once more than ``limit`` bytes are read, before they are copied."""
    hasher, offset = hashlib.sha256(), 0
    while block := os.pread(fd, CHUNK, offset):
        offset += len(block)
        if limit is not None and offset > limit:
            raise TooLarge(f"more than {limit} bytes")
        hasher.update(block)
        if out is not None:
            _write_all(out, block)
    return hasher.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file the daemon made itself (a spool copy, an output), by ``hash_fd``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


class TooLarge(Exception):
    """``hash_fd`` read more than its limit."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def walk(
    root: Path, parts: Sequence[str], make: Sequence[Access] | None = None
) -> Iterator[list[Folder]]:
    """Every folder from ``root`` down to ``root/parts...``, ``root`` first, reached as ``folder``
    reaches them. With ``make``, each missing ``parts[i]`` is made with ``make[i]``'s access: one
    tree mirrored in another (the archive's folders as readable as the inbox's they stand for, never
    more)."""
    if make is not None and len(make) != len(parts):
        raise ValueError("one access for each folder to make")
    try:
        fd = os.open(root, FOLDER_FLAGS)
    except OSError as exc:
        if exc.errno in GONE:
            raise FolderGone(root, "is gone or was replaced by a link") from None
        raise
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        chain = [Folder(fd, root)]
        for index, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise FolderGone(chain[-1].path / part, "is not a plain folder name")
            access = None if make is None else make[index]
            chain.append(stack.enter_context(chain[-1].sub(part, access)))
        yield chain


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


def _aside_name(name: str) -> str:
    raw = os.fsencode(name)
    return os.fsdecode(b"." + raw[:80]) + ASIDE_MARKER + hashlib.sha1(raw).hexdigest()[:12]
