"""How an inbox folder is watched: inotify where the kernel sees every change, polling where it cannot.

A file on a network or FUSE mount (told from /proc/self/mountinfo) can change without this kernel seeing it, so
inotify would miss what the file server writes; such inboxes are polled. Neither watcher follows a link: inotify
never adds a watch through one, and the poller looks with ``lstat``, so a link to a folder (``ln -s .. b``) is
listed as the link it is rather than walked into for ever. Watchdog's threads hand events to the event loop
through ``EventBridge`` and never run the source's code themselves. Kept apart from ``local``
because none of it knows about documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

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

POLLING_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "sshfs", "davfs", "ceph", "glusterfs", "vboxsf",
        "virtiofs", "fuse", "afs", "lustre", "gpfs", "beegfs", "ocfs2", "gfs2", "ncpfs", "coda", "vmhgfs",
    }
)  # fmt: skip
POLL_SECONDS = 1.0
STOP_RACE = "InotifyEmitter.queue_events() called when the thread is inactive"


class _StopRace(logging.Filter):
    """watchdog 7 logs an error when an inotify emitter is stopped in the middle of a read: that is a watch
    stopped, not a fault, so it is passed on as a debug record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == STOP_RACE:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


logging.getLogger("watchdog.observers.inotify").addFilter(_StopRace())
# watchdog 7 (Python 3.11+) reports a change of metadata apart; 6 reports it as a FileModifiedEvent.
OBSERVED_EVENTS = [
    FileCreatedEvent, FileModifiedEvent, FileClosedEvent, FileMovedEvent, FileDeletedEvent, DirCreatedEvent,
    DirMovedEvent, *([watchdog.events.FileAttribEvent] if hasattr(watchdog.events, "FileAttribEvent") else []),
]  # fmt: skip


# --- pure: mounts ------------------------------------------------------------------------------------------


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
    """Type of the mount holding the absolute ``path``: the deepest mount point, the last one mounted on a tie."""
    found, depth = None, -1
    for point, fstype in parse_mountinfo(mountinfo):
        if (point == path or point in path.parents) and len(point.parts) >= depth:
            found, depth = fstype, len(point.parts)
    return found


def choose_polling(setting: Literal["auto"] | bool, fstype: str | None) -> tuple[bool, str]:
    """Whether to poll, and why: inotify only sees changes made through this kernel, not by a file server."""
    if isinstance(setting, bool):
        return setting, f"configured polling = {str(setting).lower()}"
    if fstype is None:
        return False, "mount type unknown"
    if fstype in POLLING_FSTYPES or fstype.startswith("fuse."):
        return True, f"{fstype} cannot push events"
    return False, f"{fstype} pushes events"


# --- blocking: observers ----------------------------------------------------------------------------------


def _read_mountinfo() -> str:
    try:
        return os.fsdecode(Path("/proc/self/mountinfo").read_bytes())
    except OSError:
        return ""


def _new_observer(polling: bool) -> BaseObserver:
    if polling:
        return PollingObserverVFS(stat=os.lstat, listdir=os.scandir, polling_interval=POLL_SECONDS)
    if sys.platform.startswith("linux"):
        from watchdog.observers.inotify import InotifyObserver

        # Full events: a file renamed in from outside arrives as a move (whole, ready) rather than a creation.
        return InotifyObserver(generate_full_events=True)
    return Observer()


def _run_observer(polling: bool, root: Path, recursive: bool, handler: FileSystemEventHandler) -> BaseObserver:
    observer = _new_observer(polling)
    try:
        observer.schedule(handler, str(root), recursive=recursive, event_filter=OBSERVED_EVENTS)
        observer.start()
    except BaseException:
        observer.stop()
        raise
    return observer


def start_observer(
    root: Path, recursive: bool, setting: Literal["auto"] | bool, handler: FileSystemEventHandler
) -> tuple[BaseObserver, bool, str]:
    """Start the observer that suits the inbox's filesystem. Blocking (inotify walks the tree to add watches)."""
    polling, reason = choose_polling(setting, filesystem_type(root, _read_mountinfo()))
    try:
        return _run_observer(polling, root, recursive, handler), polling, reason
    except OSError as exc:
        if polling or exc.errno not in (errno.ENOSPC, errno.EMFILE):
            raise
        reason = f"inotify limit reached ({exc.strerror})"
    return _run_observer(True, root, recursive, handler), True, reason


def stop_observer(observer: BaseObserver) -> None:
    observer.stop()
    observer.join(timeout=10)


class EventBridge(FileSystemEventHandler):
    """Runs on watchdog's thread: hands each event to the event loop and returns at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[FileSystemEvent], None]) -> None:
        self._loop = loop
        self._deliver = deliver

    def dispatch(self, event: FileSystemEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._deliver, event)
