"""One watched inbox folder: which folders and names belong to it, and the scan that lists its documents.

The rules are by name alone (hidden, quarantined, a sidecar, a pattern, how deep), so that events and scans
agree on what a document is before any file is looked at. The scan walks with ``tree.walk``: iteratively, by
descriptor, never through a link and never below ``max_depth``; each folder too deep and each link to a folder
is a refusal, logged once by ``local``. Blocking where it says so; the rest is called from the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import fnmatch
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ocrwatch.config import InboxConfig
from ocrwatch.errors import NotARegularFile, SourceGone
from ocrwatch.naming import is_output
from ocrwatch.sources.beneath import Signature
from ocrwatch.sources.settle import inspect_file
from ocrwatch.sources.tree import depth_of, open_folder, walk
from ocrwatch.sources.watch import EventBridge, Watcher


class Inbox:
    """One watched folder: its config, its watcher, files settling, and what was already submitted."""

    def __init__(self, root: Path, config: InboxConfig, ignored_suffixes: tuple[str, ...]) -> None:
        self.root = root
        self.ignored_suffixes = ignored_suffixes
        self.observer: Watcher | None = None
        self.bridge: EventBridge | None = None  # the current watcher's: a batch from another is stale
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder the observer watches
        self.watched_since = 0.0  # monotonic time the current watcher started
        self.deaths = 0  # watchers that died in a row, each soon after it started: the restart backs off
        self.restarting = False
        self.rescanning = False
        self.rescan_again = False  # events were dropped again while a rescan ran
        self.overflows_unlogged = 0
        self.link_checks: set[Path] = set()  # new names to look at for links to folders, in one thread call
        self.overflow_logged_at = float("-inf")
        self.pending: dict[Path, Pending] = {}
        # path -> signature it was submitted with, or why it was refused: nothing is taken or logged twice.
        self.settled: dict[Path, Signature | str] = {}
        # Paths whose refusal was logged, kept until a scan no longer finds them refused: a name swapped back
        # and forth between a file and a link is logged once, not at every swap.
        self.refused: set[Path] = set()
        self.configure(config)

    def configure(self, config: InboxConfig) -> None:
        self.config = config
        # One expression for all the patterns, and folders compared as text: both are asked of every event.
        self.patterns = re.compile("|".join(fnmatch.translate(p.lower()) for p in config.patterns) or "(?!)")
        self.quarantine = config.quarantine_dir.expanduser().resolve() if config.quarantine_dir else None
        self._quarantine_text = None if self.quarantine is None else str(self.quarantine)
        self._quarantine_prefix = None if self.quarantine is None else str(self.quarantine).rstrip(os.sep) + os.sep
        self._root_text = str(self.root)
        self._root_prefix = self._root_text.rstrip(os.sep) + os.sep

    def _parts(self, folder: Path) -> list[str] | None:
        """The names leading from the inbox folder to ``folder`` (resolved), or None when it lies outside."""
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
        """Whether ``folder`` may hold this inbox's documents by its name: inside it, not hidden, not
        quarantined, and the inbox recursive if it is a subfolder (its depth is ``covers``'s business)."""
        parts = self._parts(folder)
        if parts is None or (parts and not self.config.recursive) or any(part.startswith(".") for part in parts):
            return False
        if self._quarantine_text is None or self._quarantine_prefix is None:
            return True
        text = str(folder)
        return not (text == self._quarantine_text or text.startswith(self._quarantine_prefix))

    def covers(self, folder: Path) -> bool:
        """Whether documents directly in ``folder`` belong to this inbox: allowed, and not too deep."""
        parts = self._parts(folder)
        return parts is not None and len(parts) <= self.max_depth and self.allows(folder)

    def accepts(self, path: Path) -> bool:
        """Whether ``path`` names a document of this inbox, by name alone (the file is looked at later)."""
        name = path.name.lower()
        if name.startswith((".", "~$")) or name.endswith(self.ignored_suffixes) or is_output(path.as_posix()):
            return False
        return self.patterns.match(name) is not None and self.covers(path.parent)

    def too_deep(self, folder: Path) -> str:
        """Why ``folder`` is refused: a refusal, said once, rather than a walk as deep as a user makes it."""
        return (
            f"{folder}: a folder {depth_of(folder, self.root)} levels below the inbox, deeper than max_depth = "
            f"{self.max_depth}; not watched and not scanned"
        )

    def prepare(self) -> tuple[int, int]:
        """The folder's identity, creating it first where configured. Blocking; OSError when it is not there."""
        if self.config.create:
            self.root.mkdir(parents=True, exist_ok=True)
        info = os.stat(self.root)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(self.root))
        return info.st_dev, info.st_ino

    def scan(self, top: Path) -> dict[Path, Signature | str]:
        """Documents under ``top`` now: canonical path -> signature, or -> why refused. Blocking.

        Raises OSError when ``top`` itself cannot be reached (gone, or a link: the scan of its parent refuses
        that) or listed, so an unreachable inbox never reads as empty.
        """
        found: dict[Path, Signature | str] = {}
        if top != self.root and not self.allows(top):
            return found
        if depth_of(top, self.root) > self.max_depth:
            os.close(open_folder(top, self.root))  # a folder still, reached without a link: refused
            found[top] = self.too_deep(top)
            return found
        for listing in walk(self.root, top, self.max_depth, self.allows):
            here = listing.folder
            for name in listing.too_deep:
                found[here / name] = self.too_deep(here / name)
            for name in listing.folder_links:
                found.update(self._entry(here / name))
            for name in listing.files:
                path = here / name
                if name not in listing.folder_links and self.accepts(path):
                    found.update(self._entry(path, document=True))
        return found

    def _entry(self, path: Path, document: bool = False) -> dict[Path, Signature | str]:
        """What the scan records of ``path``: its signature when it is a document's regular file, why it is
        refused when it is anything else, nothing when it is gone (or a regular file named as a link was)."""
        try:
            signature = inspect_file(path, self.root)
        except SourceGone:
            return {}
        except NotARegularFile as exc:
            return {path: exc.message}
        except OSError:
            return {}
        return {path: signature} if document else {}


@dataclass(eq=False)
class Pending:
    """A file seen but not yet submitted, followed by one task until it is whole."""

    path: Path
    inbox: Inbox
    detected_at: float = field(default_factory=time.time)
    closed: bool = False  # a close-after-write or move-in was seen, and no write since
    reopened: bool = False  # written again after a close: its writer comes back, so a close proves nothing
    generation: int = 0  # bumped by every event: a decision taken on an older look is looked at again
    nudge: asyncio.Event = field(default_factory=asyncio.Event)
    signature: Signature | None = None
    stable_since: float = 0.0
    task: asyncio.Task[None] | None = None
