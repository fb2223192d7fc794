"""The native watcher: inotify, one watch per folder, each added by a walk that never recurses.

watchdog's inotify emitter adds the watches of a new folder tree with a recursive ``os.walk``
(Python 3.11 and older), in ``InotifyWatchGroup._add_all_callbacks``: at start that walk runs in the
caller, and a chain of folders about 1,000 deep raises ``RecursionError`` out of
``observer.start()``; once running it runs in the ``InotifyFD`` reading thread, which a deep chain
moved in kills without a word while the observer's other threads live on, so the inbox hears nothing
more and nothing looks wrong. This watcher walks with ``tree.walk`` (by descriptor, a stack of its
own, at most ``max_depth`` levels), adds each watch through the folder's descriptor
(``/proc/self/fd/N``), so that neither a path longer than ``PATH_MAX`` nor a folder swapped for a
link can misdirect it, and never ends unannounced: whatever stops its thread, other than ``stop``,
is told to the loop (``EventBridge.died``), which starts another. Events are handed over as
watchdog's event types, as the polling observer's are, so ``local`` sees one kind of event whichever
watcher runs. Linux only.

Watches come from one budget per user of the kernel (``fs.inotify.max_user_watches``), which a user
of a shared inbox could spend with empty folders. So an inbox takes at most ``max_watches``: a
folder beyond them is left unwatched and named in ``beyond`` (the highest such folders only: a scan
of one covers those below it), and ``local`` scans those every ``poll_seconds`` instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import watchdog.events
from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from ocrwatch.sources.tree import depth_of, walk

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_MOVE_SELF = 0x40, 0x80, 0x100, 0x200, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK = (
    0x4000,
    0x8000,
    0x1000000,
    0x2000000,
    0x4000000,
)
IN_ISDIR = 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_MOVE_SELF
)
MASK |= IN_ONLYDIR | IN_EXCL_UNLINK
# struct inotify_event: wd, mask, cookie, len; then the name, NUL-padded
HEADER = struct.Struct("iIII")
READ_BYTES = 64 * 1024
PROC_FD = Path("/proc/self/fd")
BY_DESCRIPTOR = PROC_FD.is_dir()
# watchdog 7 reports a change of metadata apart; 6 (Python 3.10) reports it as a modification, and
# so do we.
ATTRIB_EVENT: type[FileSystemEvent] = getattr(watchdog.events, "FileAttribEvent", FileModifiedEvent)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


def _error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


class InotifyWatcher(threading.Thread):
    """Watches ``root`` and the folders below it that ``enter`` allows, down to ``max_depth``
    levels.

    ``start`` adds the first watches in the calling thread and raises OSError there (``ENOSPC``: the
    watch limit, ``EMFILE``: the instance limit, or the root unreadable), so the caller can fall
    back to polling. Concurrency: ``start`` and ``stop`` are called from one thread; everything else
    runs on the watcher's own, which owns the descriptors once started and closes them as it ends
    (under ``_lock``, so ``stop`` never writes to a number closed and given to another file
    meanwhile).
    """

    def __init__(
        self,
        root: Path,
        max_depth: int,
        enter: Callable[[Path], bool],
        handler: FileSystemEventHandler,
        died: Callable[[str], None],
        overflowed: Callable[[], None],
        max_watches: int | None = None,
    ) -> None:
        """``handler.dispatch`` takes each event; ``died`` hears why the thread ended unasked,
        ``overflowed`` that the kernel dropped events (the watches are rebuilt first);
        ``max_watches``: the most folders watched at once (None: as many as the kernel allows)."""
        super().__init__(name=f"inotify {root}", daemon=True)
        self.root = root
        self._max_depth = max_depth
        self._enter = enter
        self._handler = handler
        self._died = died
        self._overflowed = overflowed
        self._fd = -1
        self._wake_r, self._wake_w = -1, -1
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Paths as text: the thread builds one per event, and a storm is thousands a second.
        self._folders: dict[int, str] = {}  # watch descriptor -> the folder it watches
        self._watches: dict[str, int] = {}
        self._root_text = str(root)
        self._root_wd = -1
        self._max_watches = max_watches
        self._beyond: set[str] = set()  # the highest folders left unwatched for the bound
        self._beyond_lock = threading.Lock()  # ``beyond`` is asked from another thread

    @property
    def watched(self) -> int:
        """How many folders have a watch now."""
        return len(self._folders)

    def beyond(self) -> tuple[str, ...]:
        """The folders left unwatched for ``max_watches``, none below another (its scan covers
        them), to be scanned instead; sorted."""
        with self._beyond_lock:
            return tuple(sorted(self._beyond))

    def alive(self) -> bool:
        return self.is_alive()

    def start(self) -> None:
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        self._fd = fd
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._add_tree(self.root)
            super().start()
        except BaseException:
            self._close()
            raise

    def stop(self) -> None:
        """End the thread and wait for it (blocking, briefly: the thread wakes at once)."""
        self._stopping.set()
        with self._lock:
            if self._wake_w >= 0:
                # full already: the thread is being woken anyway
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"x")
        if self.is_alive():
            self.join(timeout=10)

    def run(self) -> None:
        try:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stopping.is_set():
                poller.poll()
                if self._stopping.is_set():
                    break
                ended = self._read_all()
                if ended is not None:
                    self._died(ended)
                    return
        except BaseException as exc:  # whatever ends this thread must reach the loop
            if not self._stopping.is_set():
                self._died(f"{type(exc).__name__}: {exc}")
        finally:
            self._close()

    # --- on the watcher's thread ------------------------------------------------------------------

    def _read_all(self) -> str | None:
        """Handle what the kernel has queued; why the watch ends, if it does."""
        while not self._stopping.is_set():
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                return None
            except InterruptedError:
                continue
            offset = 0
            while offset + HEADER.size <= len(data):
                wd, mask, _cookie, length = HEADER.unpack_from(data, offset)
                name = data[offset + HEADER.size : offset + HEADER.size + length].rstrip(b"\0")
                offset += HEADER.size + length
                ended = self._handle(wd, mask, os.fsdecode(name))
                if ended is not None:
                    return ended
        return None

    def _handle(self, wd: int, mask: int, name: str) -> str | None:
        """One kernel event: watches kept in step with the folders, and the event passed on. Returns
        why the watch ends when the inbox folder itself went away (removed, moved, unmounted): its
        events would no longer name its paths."""
        if mask & IN_Q_OVERFLOW:
            self._rebuild()
            self._overflowed()
            return None
        folder = self._folders.get(wd)
        if folder is None:
            return None  # a watch already dropped (a folder moved away or removed)
        if mask & (IN_IGNORED | IN_MOVE_SELF) and not name:
            if wd == self._root_wd:
                return f"{self.root}: the inbox folder was removed, moved or unmounted"
            if mask & IN_IGNORED:
                self._forget(wd)
            return None
        path = folder + os.sep + name
        if mask & IN_ISDIR:
            if mask & IN_CREATE:
                self._add_tree(Path(path))
                self._emit(DirCreatedEvent(path))
            elif mask & IN_MOVED_TO:
                self._add_tree(Path(path))
                self._emit(DirMovedEvent("", path))
            elif mask & IN_MOVED_FROM:
                self._drop_tree(path)
            elif mask & IN_DELETE:  # empty when removed; a watched one's watch ends by IN_IGNORED
                with self._beyond_lock:
                    self._beyond.discard(path)
            return None
        if mask & IN_CREATE:
            self._emit(FileCreatedEvent(path))
        elif mask & IN_MOVED_TO:
            self._emit(FileMovedEvent("", path))  # moved in: whole, ready
        elif mask & IN_MOVED_FROM:
            self._emit(FileMovedEvent(path, ""))
        elif mask & IN_DELETE:
            self._emit(FileDeletedEvent(path))
        elif mask & IN_CLOSE_WRITE:
            self._emit(FileClosedEvent(path))
        elif mask & IN_MODIFY:
            self._emit(FileModifiedEvent(path))
        elif mask & IN_ATTRIB:
            self._emit(ATTRIB_EVENT(path))
        return None

    def _emit(self, event: FileSystemEvent) -> None:
        self._handler.dispatch(event)

    def _add_tree(self, top: Path) -> None:
        """Watch ``top`` and the folders below it, as deep as allowed; a folder gone meanwhile is
        passed over.

        Raises OSError ``ENOSPC`` when the kernel's watch limit is reached: a partly watched inbox
        would miss events without a word, so the thread ends and its successor falls back to
        polling.
        """
        if top != self.root and (
            not self._enter(top) or depth_of(top, self.root) > self._max_depth
        ):
            return
        try:
            for listing in walk(self.root, top, self._max_depth, self._enter):
                self._add_watch(listing.fd, listing.folder)
        except OSError as exc:
            if exc.errno == errno.ENOSPC or top == self.root:
                raise

    def _add_watch(self, fd: int, folder: Path) -> None:
        text = str(folder)
        full = self._max_watches is not None and len(self._folders) >= self._max_watches
        if full and text not in self._watches:
            self._pass_over(text)
            return
        if BY_DESCRIPTOR:  # the folder itself, through its descriptor: no path is resolved again
            target, mask = os.fsencode(PROC_FD / str(fd)), MASK
        else:
            target, mask = os.fsencode(folder), MASK | IN_DONT_FOLLOW
        wd = _libc.inotify_add_watch(self._fd, target, mask)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOSPC, errno.ENOMEM) or folder == self.root:
                raise OSError(code, f"{folder}: {os.strerror(code)}")
            return  # gone or unreadable since it was listed
        old = self._folders.get(wd)
        if old is not None and old != text:
            self._watches.pop(old, None)
        self._folders[wd] = text
        self._watches[text] = wd
        if text == self._root_text:
            self._root_wd = wd

    def _pass_over(self, folder: str) -> None:
        """Leave ``folder`` unwatched for the bound: named in ``beyond``, unless a folder above it
        is already."""
        above = folder
        while len(above) > len(self._root_text):
            above = os.path.dirname(above)
            if above in self._beyond:
                return
        with self._beyond_lock:
            self._beyond.add(folder)

    def _drop_tree(self, top: str) -> None:
        """Forget the watches of ``top`` and below, and the folders left unwatched there: it was
        moved away, and its move in, if any, re-adds them."""
        prefix = top + os.sep
        for folder, wd in list(self._watches.items()):
            if folder == top or folder.startswith(prefix):
                _libc.inotify_rm_watch(self._fd, wd)
                self._forget(wd)
        with self._beyond_lock:
            self._beyond = {
                folder for folder in self._beyond if folder != top and not folder.startswith(prefix)
            }

    def _forget(self, wd: int) -> None:
        folder = self._folders.pop(wd, None)
        if folder is not None and self._watches.get(folder) == wd:
            del self._watches[folder]

    def _rebuild(self) -> None:
        """After an overflow: what moved or appeared unseen is watched anew, from a fresh walk."""
        for wd in list(self._folders):
            _libc.inotify_rm_watch(self._fd, wd)
        self._folders.clear()
        self._watches.clear()
        with self._beyond_lock:
            self._beyond.clear()
        self._root_wd = -1
        self._add_tree(self.root)

    def _close(self) -> None:
        with self._lock:
            for fd in (self._fd, self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._fd, self._wake_r, self._wake_w = -1, -1, -1
