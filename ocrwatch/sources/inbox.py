"""One watched inbox folder: which folders and names belong to it, and the scan that lists its
documents.

The rules are by name alone (``ignore``'s, quarantined, how deep), so that events and scans agree on
what a document is before any file is looked at. The scan walks with ``tree.walk``: iteratively, by
descriptor, never through a link and never below ``max_depth``; each folder too deep and each link
to a folder is a refusal, logged once by ``local``. Blocking where it says so; the rest is called
from the event loop.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from ocrwatch.config import InboxConfig
from ocrwatch.errors import NotARegularFile, SourceGone
from ocrwatch.safefs import Signature
from ocrwatch.sources.ignore import NameRules
from ocrwatch.sources.sourcefile import inspect
from ocrwatch.sources.tree import depth_of, open_folder, walk
from ocrwatch.sources.watch import EventBridge, Watcher


class Inbox:
    """One watched folder: its config, its watcher, files settling, and what was already
    submitted."""

    def __init__(self, root: Path, config: InboxConfig, ignored_suffixes: tuple[str, ...]) -> None:
        self.root = root
        self.ignored_suffixes = ignored_suffixes
        self.observer: Watcher | None = None
        self.bridge: EventBridge | None = (
            None  # the current watcher's: a batch from another is stale
        )
        self.identity: tuple[int, int] | None = (
            None  # (st_dev, st_ino) of the folder the observer watches
        )
        self.watched_since = 0.0  # monotonic time the current watcher started
        self.deaths = (
            0  # watchers that died in a row, each soon after it started: the restart backs off
        )
        self.restarting = False
        self.rescanning = False
        self.rescan_again = False  # events were dropped again while a rescan ran
        self.overflows_unlogged = 0
        # new names to look at for links to folders, in one thread call
        self.link_checks: set[Path] = set()
        self.overflow_logged_at = float("-inf")
        # Files settling, by path as text: a Path object costs about 400 bytes more.
        self.pending: dict[str, Pending] = {}
        self.settled = Settled()
        # Paths whose refusal was logged, kept until a scan no longer finds them refused: a name
        # swapped back and forth between a file and a link is logged once, not at every swap.
        self.refused: set[str] = set()
        # Files submitted that admission found done or failed with the same content, by outcome, not
        # yet said (``local._say_unchanged``), and since when (monotonic; 0: none).
        self.unchanged: Counter[str] = Counter()
        self.unchanged_since = 0.0
        self.configure(config)

    def configure(self, config: InboxConfig) -> None:
        self.config = config
        # Names by compiled expressions, and folders compared as text: both are asked of every
        # event.
        self.names = NameRules(config.patterns, config.ignore, self.ignored_suffixes)
        self.quarantine = (
            config.quarantine_dir.expanduser().resolve() if config.quarantine_dir else None
        )
        self._quarantine_text = None if self.quarantine is None else str(self.quarantine)
        self._quarantine_prefix = (
            None if self.quarantine is None else str(self.quarantine).rstrip(os.sep) + os.sep
        )
        self._root_text = str(self.root)
        self._root_prefix = self._root_text.rstrip(os.sep) + os.sep

    def _parts(self, folder: Path) -> list[str] | None:
        """The names leading from the inbox folder to ``folder`` (resolved), or None when it lies
        outside."""
        text = str(folder)
        if text == self._root_text:
            return []
        if not text.startswith(self._root_prefix):
            return None
        return text[len(self._root_prefix) :].split(os.sep)

    @property
    def max_depth(self) -> int:
        """How many levels of folders below the inbox folder are watched: none for a flat inbox."""
        return self.config.max_depth if self.config.recursive else 0

    def allows(self, folder: Path) -> bool:
        """Whether ``folder`` may hold this inbox's documents by its name: inside it, neither hidden
        nor ignored nor quarantined, and the inbox recursive if it is a subfolder (its depth is
        ``covers``'s business)."""
        parts = self._parts(folder)
        if parts is None or (parts and not self.config.recursive):
            return False
        if not all(self.names.enters(part) for part in parts):
            return False
        if self._quarantine_text is None or self._quarantine_prefix is None:
            return True
        text = str(folder)
        return not (text == self._quarantine_text or text.startswith(self._quarantine_prefix))

    def covers(self, folder: Path) -> bool:
        """Whether documents directly in ``folder`` belong to this inbox: allowed, and not too
        deep."""
        parts = self._parts(folder)
        return parts is not None and len(parts) <= self.max_depth and self.allows(folder)

    def accepts(self, path: Path) -> bool:
        """Whether ``path`` names a document of this inbox, by name alone (the file is looked at
        later)."""
        return self.names.takes(path) and self.covers(path.parent)

    def too_deep(self, folder: Path) -> str:
        """Why ``folder`` is refused: a refusal, said once, rather than a walk as deep as a user
        makes it."""
        return (
            f"{folder}: a folder {depth_of(folder, self.root)} levels below the inbox, deeper "
            "than max_depth = "
            f"{self.max_depth}; not watched and not scanned"
        )

    def prepare(self) -> tuple[int, int]:
        """The folder's identity, creating it first where configured. Blocking; OSError when it is
        not there."""
        if self.config.create:
            self.root.mkdir(parents=True, exist_ok=True)
        info = os.stat(self.root)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(self.root))
        return info.st_dev, info.st_ino

    def scan(self, top: Path) -> dict[str, bytes | str]:
        """Documents under ``top`` now: canonical path as text -> signature (packed, as
        ``Settled`` keeps it), or -> why refused. Blocking. Text and bytes rather than a Path and
        a tuple: a scan of a whole inbox of 100,000 files holds them all at once, at a third of
        the cost.

        Raises OSError when ``top`` itself cannot be reached (gone, or a link: the scan of its
        parent refuses that) or listed, so an unreachable inbox never reads as empty.
        """
        found: dict[str, bytes | str] = {}
        if top != self.root and not self.allows(top):
            return found
        if depth_of(top, self.root) > self.max_depth:
            os.close(open_folder(top, self.root))  # a folder still, reached without a link: refused
            found[str(top)] = self.too_deep(top)
            return found
        for listing in walk(self.root, top, self.max_depth, self.allows):
            here = listing.folder
            for name in listing.too_deep:
                found[str(here / name)] = self.too_deep(here / name)
            for name in listing.folder_links:
                found.update(self._entry(here / name))
            for name in listing.files:
                path = here / name
                if name not in listing.folder_links and self.accepts(path):
                    found.update(self._entry(path, document=True))
        return found

    def _entry(self, path: Path, document: bool = False) -> dict[str, bytes | str]:
        """What the scan records of ``path``: its signature when it is a document's regular file,
        why it is refused when it is anything else, nothing when it is gone (or a regular file named
        as a link was)."""
        try:
            signature = inspect(path, self.root)
        except SourceGone:
            return {}
        except NotARegularFile as exc:
            return {str(path): exc.message}
        except OSError:
            return {}
        return {str(path): _SIGNATURE.pack(*signature)} if document else {}


_SIGNATURE = struct.Struct("=QqqQQ")  # size, mtime and ctime (ns), inode, device


class Settled:
    """What was done with each file of the inbox: the signature it was submitted with, or why it
    was refused, so nothing is taken or logged twice, and a file submitted before and written
    again waits for quiet. Kept for as long as a scan finds the file, for a whole inbox of them:
    so each entry is its path as text and its signature packed into 40 bytes (about 250 bytes,
    against 700 as a Path and a tuple of five ints)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, bytes | str] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, (str, Path)) and os.fspath(path) in self._entries

    def matches(self, path: Path | str, seen: Signature | bytes | str | None) -> bool:
        """Whether ``seen`` is what was recorded for ``path`` (None: nothing was)."""
        return self._entries.get(os.fspath(path)) == (None if seen is None else packed(seen))

    def submitted(self, path: Path | str) -> bool:
        """Whether ``path`` was submitted (rather than refused, or never seen)."""
        return isinstance(self._entries.get(os.fspath(path)), bytes)

    def submitted_in(self, folder: Path) -> Iterator[Path]:
        """The files submitted directly in ``folder``."""
        text = os.fspath(folder)
        for key, seen in self._entries.items():
            if isinstance(seen, bytes) and key.rpartition(os.sep)[0] == text:
                yield Path(key)

    def record(self, path: Path | str, seen: Signature | str) -> None:
        self._entries[os.fspath(path)] = packed(seen)

    def forget(self, path: Path | str) -> None:
        self._entries.pop(os.fspath(path), None)

    def keep_only(self, paths: Iterable[Path | str]) -> None:
        """Forget every file but ``paths``: what a scan of the whole inbox found."""
        kept = {os.fspath(path) for path in paths}
        for key in self._entries.keys() - kept:
            del self._entries[key]


def packed(seen: Signature | bytes | str) -> bytes | str:
    """A signature as ``Settled`` and the scan keep it (40 bytes); anything else as it is."""
    return _SIGNATURE.pack(*seen) if isinstance(seen, Signature) else seen


class Pending:
    """A file seen but not yet submitted, looked at by the settle deadlines until it is whole.
    Slots and the path as text: a burst of files holds one of these each."""

    __slots__ = (
        "key",
        "inbox",
        "detected_at",
        "closed",
        "reopened",
        "generation",
        "signature",
        "stable_since",
    )

    def __init__(self, key: str, inbox: Inbox) -> None:
        self.key = key
        self.inbox = inbox
        self.detected_at = time.time()
        self.closed = False  # a close-after-write or move-in was seen, and no write since
        # Written again after a close: its writer comes back, so a close proves nothing.
        self.reopened = False
        # Bumped by every event: a decision taken on an older look is looked at again.
        self.generation = 0
        self.signature: Signature | None = None
        self.stable_since = 0.0

    @property
    def path(self) -> Path:
        return Path(self.key)
