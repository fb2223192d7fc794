"""Folders reached one component at a time without following a link, and what is done inside them.

``Folder`` wraps one folder's descriptor; every read, write, rename and removal inside it goes
through that descriptor (``dir_fd=``), so no path is resolved again after it was checked.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import hashlib
import os
import pwd
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocrwatch.errors import UntrustedFolder
from ocrwatch.safefs.base import (
    FILE_FLAGS,
    FOLDER_FLAGS,
    GONE,
    NEW_FLAGS,
    NO_LINK,
    Access,
    FolderGone,
    Occupant,
    Replaced,
    Signature,
    aside_name,
    describe,
    hash_fd,
    read_head,
    temporary_name,
    write_all,
)


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
    """An open folder reached without following a link; ``path`` names it in messages only, never to
    act."""

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
        """A read-only descriptor of the regular file ``name`` (None: nothing there, or not a
        regular file)."""
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
        """What lies at ``name`` (None: nothing, or a name too long to exist), reading at most
        ``limit`` bytes. Never follows a link, never blocks on a FIFO, never reads a device: the
        type is checked with ``lstat`` and again with ``fstat`` on a descriptor opened ``O_NOFOLLOW
        | O_NONBLOCK``."""
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
        """Write ``data`` (bytes, or a file's content) under ``name``'s fixed hidden temporary name
        (a leftover of a killed write is replaced), created exclusively, given ``access`` and
        fsynced; ``commit`` renames it over ``name``. Between the two, the caller may record what it
        is about to publish."""
        tmp = temporary_name(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)  # unlinking a symlink never touches its target
        with self._new_file(tmp) as fd:
            if isinstance(data, Path):
                content = os.open(data, os.O_RDONLY | os.O_CLOEXEC)  # the job's own spool file
                try:
                    digest = hash_fd(content, out=fd)
                finally:
                    os.close(content)
            else:
                digest = hashlib.sha256(data).hexdigest()
                write_all(fd, data)
            access.apply(fd)
            os.fsync(fd)
            info = os.fstat(fd)
        return Staged(self, name, tmp, info.st_ino, info.st_size, digest)

    def commit(self, staged: Staged, *, replace: bool = True) -> None:
        """Rename a staged file over its name, so that the name is always absent, the old file or
        all of the new one; then the folder is fsynced. ``replace=False``: only while the name is
        free, else ``FileExistsError`` (the temporary file goes)."""
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
            os.link(
                staged.tmp,
                staged.name,
                src_dir_fd=self.fd,
                dst_dir_fd=self.fd,
                follow_symlinks=False,
            )
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
        """Remove the file ``name`` (a link itself, never its target); False where nothing was
        there."""
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

    @contextlib.contextmanager
    def _new_file(self, name: str) -> Iterator[int]:
        """A descriptor of the new file ``name`` here, created exclusively and private; whatever
        fails while it is filled takes the file away again, so no half-written file is left."""
        fd = os.open(name, NEW_FLAGS, 0o600, dir_fd=self.fd)
        try:
            yield fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
            raise
        finally:
            os.close(fd)

    def copy_in(self, fd: int, new: str) -> tuple[os.stat_result, str]:
        """The open file ``fd`` copied to the new file ``new`` here (never replacing one), with its
        owner (where the daemon may set it), mode and times, fsynced: a move across filesystems
        leaves the file as its owner had it. Its ``fstat`` and the sha256 of what was copied."""
        info = os.fstat(fd)
        with self._new_file(new) as out:
            digest = hash_fd(fd, out=out)
            if os.geteuid() == 0:
                os.fchown(out, info.st_uid, info.st_gid)
            os.fchmod(out, stat.S_IMODE(info.st_mode) & 0o777)  # no set-id bit on a copy root made
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.fsync(out)
            made = os.fstat(out)
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
        self,
        name: str,
        target: Folder,
        new: str,
        fd: int,
        info: os.stat_result,
        check: Callable[[], None] | None,
    ) -> os.stat_result:
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
        aside = aside_name(name)
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
        """Remove the folder ``name`` once it is empty; False where it is not (a user's file keeps
        it)."""
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
        """The folder ``name`` inside this one, never a link. With ``make``, it is made with that
        access where missing, and one already there is used only while it is just what ocrwatch
        makes (``Access.made_as``), else ``UntrustedFolder``: a folder another user made first, or
        one whose inbox folder changed hands, is never written through."""
        if make is None:
            fd = self._open_sub(name)
        else:
            with _MAKING:
                fd = self._made(name, make)
        yield from _held(fd, self.path / name)

    def _open_sub(self, name: str) -> int:
        try:
            return os.open(name, FOLDER_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in GONE:
                raise FolderGone(self.path / name, _why(self, name)) from None
            raise

    def _made(self, name: str, make: Access) -> int:
        """A descriptor of the folder ``name``, made private and then given ``make``'s access, or
        found as ``make`` makes it. What is opened after the ``mkdir`` is checked to be the
        daemon's (the folder just made), never taken on trust."""
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
            made = True
        except FileExistsError:
            made = False
        fd = self._open_sub(name)
        try:
            info = os.fstat(fd)
            if made and info.st_uid == os.geteuid():
                make.apply(fd, folder=True)
                self.fsync()
            elif not make.made_as(info):
                raise _untrusted(self.path / name, info, make)
        except BaseException:
            os.close(fd)
            raise
        return fd


_MAKING = threading.Lock()
"""Held while a folder is made and given its access, and while one found is checked: a thread never
takes another's folder, made private a moment before its access is set, for one it may not trust."""


def _untrusted(path: Path, info: os.stat_result, make: Access) -> UntrustedFolder:
    """The refusal of the folder ``path`` (of ``info``), naming what it is and what it should be."""
    expected = _who(make.uid, make.gid) if os.geteuid() == 0 else _who(os.geteuid(), None)
    return UntrustedFolder(
        f"{path} is owned by {_who(info.st_uid, info.st_gid)} with mode "
        f"{info.st_mode & 0o777:04o}, where ocrwatch makes it owned by {expected} with mode "
        f"{make.folder_mode():04o}, as the one it stands for: nothing is written through it",
        hint=f"give {path} that owner and mode (chown, chmod) or move it away (ocrwatch makes it "
        "anew); the document is taken again when the inbox is next scanned",
    )


def _who(uid: int, gid: int | None) -> str:
    """``uid`` (and ``gid``) by number, and by name where the system knows it."""
    try:
        user = f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        user = str(uid)
    if gid is None:
        return f"user {user}"
    try:
        group = f"{gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        group = str(gid)
    return f"user {user}, group {group}"


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
def folder(root: Path, parts: Sequence[str] = ()) -> Iterator[Folder]:
    """The folder ``root/parts...``, reached from ``root`` (a configured folder, resolved at start)
    one component at a time without following a link; a missing one, a link or a non-folder on the
    way is ``FolderGone``."""
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
            here = stack.enter_context(here.sub(part))
        yield here


@contextlib.contextmanager
def walk(
    root: Path, parts: Sequence[str], make: Sequence[Access] | None = None
) -> Iterator[list[Folder]]:
    """Every folder from ``root`` down to ``root/parts...``, ``root`` first, reached as ``folder``
    reaches them. With ``make``, one tree mirrored in another: ``parts[i]`` stands for a folder of
    ``make[i]``'s access, is made so where missing (as readable as the folder it stands for, never
    more), and where it exists is used only while it is as one made so (``Folder.sub``)."""
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
