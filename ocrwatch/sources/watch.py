"""How an inbox folder is watched: inotify where the kernel sees every change, polling where it
cannot.

A file on a network or FUSE mount (told from /proc/self/mountinfo) can change without this kernel
seeing it, so inotify would miss what the file server writes; such inboxes are polled. Neither
watcher follows a link: the native one (``inotify``, ours) adds each watch through a folder's
descriptor reached without following one, and the poller looks with ``lstat``, so a link to a folder
(``ln -s .. b``) is listed as the link it is rather than walked into for ever. Neither goes deeper
than the inbox's ``max_depth``: a chain of folders thousands of levels deep costs one level more
than the limit, never a ``RecursionError`` (watchdog's poller recurses once per level, hence the
bound on ``max_depth``). The native one takes at most ``[[inbox]] max_watches`` watches and names
the folders beyond them (``Watcher.beyond``), which ``local`` scans every ``poll_seconds``. Watcher
threads hand events to the event loop through ``EventBridge``, in batches, and never run the
source's code themselves. Kept apart from ``local`` because none of it
knows about documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

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
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserverVFS

from ocrwatch.sources.inotify import InotifyWatcher
from ocrwatch.sources.tree import depth_of

POLLING_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "sshfs",
        "davfs",
        "ceph",
        "glusterfs",
        "vboxsf",
        "virtiofs",
        "fuse",
        "afs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "ncpfs",
        "coda",
        "vmhgfs",
    }
)
MAX_QUEUED_EVENTS = 2048
"""Events waiting for the loop, at most: what the loop handles in one go, tens of milliseconds, so
that a storm never keeps it from a signal for long; beyond, they are dropped and a scan finds what
they named."""
# watchdog 7 (Python 3.11+) reports a change of metadata apart; 6 reports it as a FileModifiedEvent.
OBSERVED_EVENTS = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    *([watchdog.events.FileAttribEvent] if hasattr(watchdog.events, "FileAttribEvent") else []),
]


# --- pure: mounts ---------------------------------------------------------------------------------


def parse_mountinfo(text: str) -> list[tuple[Path, str]]:
    """(mount point, filesystem type) for each line of /proc/self/mountinfo, in mount order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:-1]:
            continue
        separator = fields.index("-", 6)
        point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), fields[4])
        mounts.append((Path(point), fields[separator + 1]))
    return mounts


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """Type of the mount holding the absolute ``path``: the deepest mount point, the last one
    mounted on a tie."""
    found, depth = None, -1
    for point, fstype in parse_mountinfo(mountinfo):
        if (point == path or point in path.parents) and len(point.parts) >= depth:
            found, depth = fstype, len(point.parts)
    return found


def choose_polling(setting: Literal["auto"] | bool, fstype: str | None) -> tuple[bool, str]:
    """Whether to poll, and why: inotify only sees changes made through this kernel, not by a file
    server."""
    if isinstance(setting, bool):
        return setting, f"configured polling = {str(setting).lower()}"
    if fstype is None:
        return False, "mount type unknown"
    if fstype in POLLING_FSTYPES or fstype.startswith("fuse."):
        return True, f"{fstype} cannot push events"
    return False, f"{fstype} pushes events"


# --- blocking: watchers ---------------------------------------------------------------------------


class Watcher(Protocol):
    """A running watcher of one inbox, native or polling, as ``local`` drives it."""

    def alive(self) -> bool:
        """Whether every thread it needs still runs: one that ended must be replaced, or the inbox
        goes deaf."""

    def stop(self) -> None:
        """End its threads and wait for them. Blocking."""

    def beyond(self) -> tuple[str, ...]:
        """The folders it does not watch for its bound (``max_watches``), to be scanned instead."""


class PollingWatcher:
    """watchdog's polling observer, whose emitter thread can end while its dispatcher thread lives
    on."""

    def __init__(self, observer: BaseObserver) -> None:
        self.observer = observer

    def alive(self) -> bool:
        return self.observer.is_alive() and all(
            emitter.is_alive() for emitter in list(self.observer.emitters)
        )

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=10)

    def beyond(self) -> tuple[str, ...]:
        return ()  # a poller looks at every folder, however many


def _read_mountinfo() -> str:
    try:
        return os.fsdecode(Path("/proc/self/mountinfo").read_bytes())
    except OSError:
        return ""


def bounded_listdir(
    root: Path, max_depth: int, enter: Callable[[Path], bool]
) -> Callable[[str | None], Iterator[os.DirEntry[str]]]:
    """The poller's ``listdir``: a folder deeper than ``max_depth`` or not entered is listed as
    empty, so watchdog's recursive snapshot stops there; a folder below the root that cannot be
    listed (a path longer than ``PATH_MAX``, gone, unreadable) is empty too, rather than failing the
    snapshot of the whole inbox."""

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        path = str(root) if path is None else path
        folder = Path(path)
        if folder != root and (depth_of(folder, root) > max_depth or not enter(folder)):
            return iter(())
        try:
            with os.scandir(path) as entries:
                return iter(list(entries))
        except OSError:
            if folder == root:
                raise
            return iter(())

    return listdir


def _start_watcher(
    polling: bool,
    root: Path,
    max_depth: int,
    enter: Callable[[Path], bool],
    bridge: EventBridge,
    poll_seconds: float,
    max_watches: int,
) -> Watcher:
    if not polling and sys.platform.startswith("linux"):
        watcher = InotifyWatcher(
            root, max_depth, enter, bridge, bridge.died, bridge.overflowed, max_watches
        )
        watcher.start()
        return watcher
    if polling:
        observer: BaseObserver = PollingObserverVFS(
            stat=os.lstat,
            listdir=bounded_listdir(root, max_depth, enter),
            polling_interval=poll_seconds,
        )
    else:
        observer = Observer()
    try:
        observer.schedule(bridge, str(root), recursive=max_depth > 0, event_filter=OBSERVED_EVENTS)
        observer.start()
    except BaseException:
        observer.stop()
        raise
    return PollingWatcher(observer)


def start_watcher(
    root: Path,
    max_depth: int,
    enter: Callable[[Path], bool],
    setting: Literal["auto"] | bool,
    bridge: EventBridge,
    poll_seconds: float,
    max_watches: int,
) -> tuple[Watcher, bool, str]:
    """Start the watcher that suits the inbox's filesystem, and say which and why. Blocking (the
    native one walks the tree to add its watches). ``max_depth`` 0 watches the inbox folder alone;
    ``poll_seconds``: how often a poller looks; ``max_watches``: the native one's bound."""
    polling, reason = choose_polling(setting, filesystem_type(root, _read_mountinfo()))
    try:
        return (
            _start_watcher(polling, root, max_depth, enter, bridge, poll_seconds, max_watches),
            polling,
            reason,
        )
    except OSError as exc:
        if polling or exc.errno not in (errno.ENOSPC, errno.EMFILE, errno.ENOMEM):
            raise
        reason = f"inotify limit reached ({exc.strerror})"
    watcher = _start_watcher(True, root, max_depth, enter, bridge, poll_seconds, max_watches)
    return watcher, True, reason


# --- the hand-over to the loop --------------------------------------------------------------------


@dataclass
class Batch:
    """What a watcher said since the loop last looked."""

    events: list[FileSystemEvent]
    overflowed: bool = False  # events were dropped: only a scan finds what they named
    died: str | None = None  # why the watcher's thread ended without being asked to


class EventBridge(FileSystemEventHandler):
    """Runs on watcher threads: queues each event and wakes the event loop once per batch, not once
    per event.

    Each ``call_soon_threadsafe`` writes a byte to the loop's one self-pipe, the pipe asyncio's own
    signal handling reads signals from too (``daemon.SignalCatcher`` no longer depends on it), and a
    loop that reads a byte per event falls behind in a storm. So a thread wakes the loop only when
    nothing it queued is waiting for the loop already. At most ``limit`` events wait; beyond, they
    are dropped for one ``overflowed`` batch (a scan), so a storm cannot grow memory without bound.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Batch], None],
        limit: int = MAX_QUEUED_EVENTS,
    ) -> None:
        self._loop = loop
        self._deliver = deliver
        self._limit = limit
        self._lock = threading.Lock()
        self._batch = Batch([])
        self._waking = False

    def dispatch(self, event: FileSystemEvent) -> None:
        with self._lock:
            events = self._batch.events
            if self._batch.overflowed:
                pass
            elif len(events) >= self._limit:
                events.clear()
                self._batch.overflowed = True
            elif not events or events[-1] != event:  # a writer's run of identical events is one
                events.append(event)
            wake = self._arm()
        if wake:
            self._wake()

    def overflowed(self) -> None:
        """The kernel dropped events: what is queued is dropped too, for a scan."""
        with self._lock:
            self._batch.events.clear()
            self._batch.overflowed = True
            wake = self._arm()
        if wake:
            self._wake()

    def died(self, reason: str) -> None:
        with self._lock:
            self._batch.died = reason
            wake = self._arm()
        if wake:
            self._wake()

    def _arm(self) -> bool:
        """Under the lock: whether this caller must wake the loop (no wake is on its way yet)."""
        if self._waking:
            return False
        self._waking = True
        return True

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """On the loop: take what is queued, let the threads queue afresh, and deliver it."""
        with self._lock:
            batch, self._batch, self._waking = self._batch, Batch([]), False
        self._deliver(batch)
