"""Local inbox folders as a source: watchdog events plus scans, and a file is submitted only once it is whole.

Each ``[[inbox]]`` gets its own observer (``watch`` chooses inotify or polling). Events only say *where to
look*: a scan at start and every ``reconcile_seconds`` finds what events missed, and every candidate passes the
same readiness check (closed or stable, then the cheap probe of ``settle``) before ``submit``. A document
submitted before is submitted again, and so redone, once its sidecars are gone or no longer its own while its
ledger row says done (``lapsed``, the daemon's question): asked as soon as an event names one of its sidecars,
and of every unchanged document at each scan, at the cost of a ledger read and a sidecar's head, never a hash.
Every stat, probe and scan runs in a worker thread, so the loop never blocks on a slow filesystem, and nothing is opened
before ``lstat`` says it is a regular file, so a FIFO cannot hang a reader. No link is followed, to a file or
to a folder, inside the inbox or out of it: each is refused with one log line (``beneath``).

Concurrency: all methods are called from the event loop; ``stop`` once, after ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fnmatch
import os
import stat
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import BaseObserver

from ocrwatch.config import InboxConfig
from ocrwatch.errors import ConfigError, NotARegularFile, OcrwatchError, SourceGone
from ocrwatch.naming import is_output, sidecar_names
from ocrwatch.sources.base import Fetched, Job, LocalFile, Outcome, Reject, Submit
from ocrwatch.sources.beneath import Signature, fetch_copy
from ocrwatch.sources.quarantine import Owns, quarantine
from ocrwatch.sources.settle import inspect_file, probe
from ocrwatch.sources.watch import EventBridge, start_observer, stop_observer

log = structlog.get_logger()

T = TypeVar("T")

TEMPORARY_SUFFIXES = (".part", ".tmp", ".crdownload")
PROBE_GIVE_UP_SETTLES = 10
PROBE_GIVE_UP_MIN_SECONDS = 30.0
"""A file stable this long that still fails the probe is submitted, so the renderer names its real defect."""
RECHECK_MIN_SECONDS = 0.25
BLOCKING_CALLS = 8
"""Stats and probes in flight at once, so a scan of a big inbox leaves worker threads for the rest of the daemon."""


# --- per inbox ---------------------------------------------------------------------------------------------


class _Inbox:
    """One watched folder: its config, its observer, files settling, and what was already submitted."""

    def __init__(self, root: Path, config: InboxConfig, ignored_suffixes: tuple[str, ...]) -> None:
        self.root = root
        self.ignored_suffixes = ignored_suffixes
        self.observer: BaseObserver | None = None
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder the observer watches
        self.pending: dict[Path, _Pending] = {}
        # path -> signature it was submitted with, or why it was refused: nothing is taken or logged twice.
        self.settled: dict[Path, Signature | str] = {}
        # Paths whose refusal was logged, kept until a scan no longer finds them refused: a name swapped back
        # and forth between a file and a link is logged once, not at every swap.
        self.refused: set[Path] = set()
        self.configure(config)

    def configure(self, config: InboxConfig) -> None:
        self.config = config
        self.patterns = tuple(pattern.lower() for pattern in config.patterns)
        self.quarantine = config.quarantine_dir.expanduser().resolve() if config.quarantine_dir else None

    def covers(self, folder: Path) -> bool:
        """Whether documents directly in ``folder`` belong to this inbox: inside it, not hidden, not quarantined."""
        if not folder.is_relative_to(self.root):
            return False
        parts = folder.relative_to(self.root).parts
        if (parts and not self.config.recursive) or any(part.startswith(".") for part in parts):
            return False
        return self.quarantine is None or not folder.is_relative_to(self.quarantine)

    def accepts(self, path: Path) -> bool:
        """Whether ``path`` names a document of this inbox, by name alone (the file is looked at later)."""
        name = path.name.lower()
        if name.startswith((".", "~$")) or name.endswith(self.ignored_suffixes) or is_output(path.as_posix()):
            return False
        return self.covers(path.parent) and any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)

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

        Raises OSError when ``top`` itself cannot be listed, so an unreachable inbox never reads as empty.
        """

        def fail(exc: OSError) -> None:
            if exc.filename is None or Path(exc.filename) == top:
                raise exc

        found: dict[Path, Signature | str] = {}
        if top != self.root and os.path.islink(top):
            return found  # os.walk would follow it; the scan of its parent refuses it
        for folder, dirnames, filenames in os.walk(top, onerror=fail):
            here = Path(folder)
            dirnames[:] = [name for name in dirnames if self.covers(here / name)]
            for name in [name for name in dirnames if os.path.islink(here / name)]:
                dirnames.remove(name)  # os.walk does not go in either; said here so that the refusal is logged
                with contextlib.suppress(SourceGone, OSError):
                    try:
                        inspect_file(here / name, self.root)
                    except NotARegularFile as exc:
                        found[here / name] = exc.message
            for name in filenames:
                path = here / name
                if not self.accepts(path):
                    continue
                try:
                    found[path] = inspect_file(path, self.root)
                except SourceGone:
                    continue
                except NotARegularFile as exc:
                    found[path] = exc.message
        return found


@dataclass(eq=False)
class _Pending:
    """A file seen but not yet submitted, followed by one task until it is whole."""

    path: Path
    inbox: _Inbox
    detected_at: float = field(default_factory=time.time)
    closed: bool = False  # a close-after-write or move-in was seen, and no write since
    reopened: bool = False  # written again after a close: its writer comes back, so a close proves nothing
    generation: int = 0  # bumped by every event: a decision taken on an older look is looked at again
    nudge: asyncio.Event = field(default_factory=asyncio.Event)
    signature: Signature | None = None
    stable_since: float = 0.0
    task: asyncio.Task[None] | None = None


# --- the source ---------------------------------------------------------------------------------------------


class LocalSource:
    """Watches local inbox folders and submits each document once it is completely written."""

    name = "local"

    def __init__(
        self, inboxes: Sequence[InboxConfig], *, reconcile_seconds: float, name_template: str,
        lapsed: Callable[[Job], bool] = lambda job: False,
    ) -> None:  # fmt: skip
        """``lapsed``: whether a document submitted before was done and has lost its sidecars since (blocking)."""
        self._reconcile_seconds = reconcile_seconds
        self._name_template = name_template
        self._lapsed = lapsed
        # Every sidecar ends like one of these, whatever the template: a sidecar is never taken for a document.
        self._ignored = TEMPORARY_SUFFIXES + tuple(
            "." + name.rsplit(".", 1)[-1] for name in sidecar_names("x", name_template).values()
        )
        self._inboxes = {root: _Inbox(root, config, self._ignored) for root, config in _by_root(inboxes).items()}
        self._submit: Submit | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciler: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._io = asyncio.Semaphore(BLOCKING_CALLS)
        self.owns_output: Owns | None = None  # the record of outputs (the daemon's): may an error sidecar go along?

    async def start(self, submit: Submit, reject: Reject) -> None:
        """Watch every inbox, then scan it (in that order, so nothing slips between), then reconcile periodically.

        ``reject`` is never called: a file is only ever submitted, even one that never passes the probe, so that
        the pipeline names its defect.
        """
        self._submit, self._loop = submit, asyncio.get_running_loop()
        async with self._lock:
            for inbox in self._inboxes.values():
                await self._refresh(inbox)
        self._reconciler = asyncio.create_task(self._reconcile_forever(), name="local-reconcile")

    async def stop(self) -> None:
        """Stop observers and drop files still settling: the scan at the next start finds them again."""
        self._submit = None
        tasks = [*self._background, *(p.task for i in self._inboxes.values() for p in i.pending.values() if p.task)]
        if self._reconciler is not None:
            tasks.append(self._reconciler)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._unwatch(inbox) for inbox in self._inboxes.values()))

    async def update_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """Apply a reloaded config: watch new inboxes, forget removed ones, re-watch changed ones.

        Files settling in an inbox that stays are kept. Raises ``ConfigError`` before changing anything when
        two inboxes name the same folder.
        """
        wanted = _by_root(inboxes)
        async with self._lock:
            for root in self._inboxes.keys() - wanted.keys():
                retired = self._inboxes.pop(root)
                for pending in retired.pending.values():
                    if pending.task is not None:
                        pending.task.cancel()
                await self._unwatch(retired)
                log.info("inbox_removed", path=str(root))
            for root, config in wanted.items():
                inbox = self._inboxes.get(root)
                if inbox is None:
                    inbox = self._inboxes[root] = _Inbox(root, config, self._ignored)
                elif inbox.config != config:
                    inbox.configure(config)
                    await self._unwatch(inbox)
                else:
                    continue
                if self._submit is not None:
                    await self._refresh(inbox)

    def inboxes(self) -> dict[Path, InboxConfig]:
        """The inboxes watched now (a reload changes them), by resolved folder."""
        return {root: inbox.config for root, inbox in self._inboxes.items()}

    async def fetch(self, job: Job, spool_dir: Path) -> Fetched:
        """Open the file once, beneath its inbox and without following links, and copy it through that
        descriptor into the spool folder while hashing it: what is rendered is what was checked and hashed."""
        origin = job.origin
        if not isinstance(origin, LocalFile):
            raise TypeError(f"LocalSource cannot fetch {origin!r}")
        return await asyncio.to_thread(fetch_copy, origin.path, origin.inbox, spool_dir, job.max_bytes)

    async def finish(self, job: Job, outcome: Outcome) -> None:
        """Move a failed document to its inbox's ``quarantine_dir`` where one is set; otherwise leave it be."""
        origin = job.origin
        inbox = self._inboxes.get(origin.inbox) if isinstance(origin, LocalFile) else None
        if outcome != "failed" or inbox is None or inbox.quarantine is None:
            return
        assert isinstance(origin, LocalFile)
        pending = inbox.pending.get(origin.path)
        if pending is not None and pending.signature != inbox.settled.get(origin.path):
            log.info("local_quarantine_skipped", path=str(origin.path), reason="a new version is being written")
            return
        try:
            moved = await asyncio.to_thread(
                quarantine, origin.path, origin.inbox, inbox.quarantine, self._name_template, self.owns_output
            )
        except (OSError, OcrwatchError) as exc:
            log.error("local_quarantine_failed", path=str(origin.path), error=str(exc))
            return
        log.warning("local_quarantined", path=str(origin.path), to=str(moved))

    # --- watching ------------------------------------------------------------------------------------------

    async def _refresh(self, inbox: _Inbox) -> None:
        """Make sure the inbox is watched (again, if its folder was replaced or remounted), then scan it."""
        try:
            identity = await asyncio.to_thread(inbox.prepare)
            if inbox.observer is None or identity != inbox.identity:
                await self._unwatch(inbox)
                await self._watch(inbox)
                inbox.identity = identity
            found = await asyncio.to_thread(inbox.scan, inbox.root)
        except OSError as exc:
            log.warning("inbox_unavailable", path=str(inbox.root), error=str(exc))
            await self._unwatch(inbox)
            return
        self._take(inbox, found, closed=False)
        for path in inbox.settled.keys() - found.keys():
            del inbox.settled[path]
        inbox.refused = {path for path in inbox.refused if isinstance(found.get(path), str)}
        await self._redo_lapsed(inbox, [path for path, seen in found.items() if inbox.settled.get(path) == seen])

    async def _redo_lapsed(self, inbox: _Inbox, paths: Iterable[Path]) -> None:
        """Submit again those of ``paths`` that were submitted, are not being looked at, and whose sidecars have
        lapsed; one worker thread asks for them all."""
        asked = [path for path in paths if isinstance(inbox.settled.get(path), Signature) and path not in inbox.pending]
        if not asked:
            return
        try:
            lapsed = await self._blocking(lambda: [path for path in asked if self._lapsed(self._job(inbox, path))])
        except Exception:  # the ledger busy or closing: the next scan asks again
            log.exception("local_lapsed_check_failed", inbox=str(inbox.root))
            return
        for path in lapsed:
            if self._inboxes.get(inbox.root) is inbox and path in inbox.settled:
                log.info("local_sidecars_lapsed", path=str(path), inbox=str(inbox.root))
                del inbox.settled[path]
                self._consider(inbox, path, closed=True)

    def _sidecar_of(self, inbox: _Inbox, path: Path) -> Path | None:
        """The submitted document whose Markdown or JSON sidecar ``path`` names, beside it; None for any other
        file (looked for only when such a name goes away or is written over, which is rare)."""
        if not path.name.endswith((".md", ".json")):
            return None
        for document, seen in inbox.settled.items():
            if document.parent == path.parent and isinstance(seen, Signature):
                names = sidecar_names(document.name, self._name_template)
                if path.name in (names["md"], names["json"]):
                    return document
        return None

    async def _watch(self, inbox: _Inbox) -> None:
        assert self._loop is not None
        bridge = EventBridge(self._loop, partial(self._on_event, inbox))
        inbox.observer, polling, reason = await asyncio.to_thread(
            start_observer, inbox.root, inbox.config.recursive, inbox.config.polling, bridge
        )
        log.info(
            "inbox_watching",
            path=str(inbox.root),
            observer="polling" if polling else "native",
            reason=reason,
            recursive=inbox.config.recursive,
        )

    async def _unwatch(self, inbox: _Inbox) -> None:
        observer, inbox.observer, inbox.identity = inbox.observer, None, None
        if observer is not None:
            await asyncio.to_thread(stop_observer, observer)

    async def _reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(self._reconcile_seconds)
            async with self._lock:
                for inbox in list(self._inboxes.values()):
                    try:
                        await self._refresh(inbox)
                    except Exception:
                        log.exception("inbox_reconcile_failed", path=str(inbox.root))

    def _on_event(self, inbox: _Inbox, event: FileSystemEvent) -> None:
        """On the loop: turn one watchdog event into a file to look at (or a folder to scan)."""
        if self._submit is None or self._inboxes.get(inbox.root) is not inbox:
            return  # stopped, or from the observer of an inbox since removed
        source = Path(os.fsdecode(event.src_path)) if event.src_path else None
        target = Path(os.fsdecode(event.dest_path)) if event.dest_path else None
        if isinstance(event, DirCreatedEvent) and source is not None:
            self._spawn(self._scan_into(inbox, source, closed=False))
        elif isinstance(event, DirMovedEvent) and target is not None:
            # Files inside a moved-in folder emit no events of their own; they were whole when moved.
            self._spawn(self._scan_into(inbox, target, closed=True))
        elif isinstance(event, (FileMovedEvent, FileDeletedEvent)):
            if source is not None:
                inbox.settled.pop(source, None)
                self._sidecar_changed(inbox, source)
            if target is not None:
                self._consider(inbox, target, closed=True)
        elif isinstance(event, FileCreatedEvent) and source is not None and not inbox.accepts(source):
            if inbox.covers(source.parent):
                self._spawn(self._refuse_folder_link(inbox, source))
        elif source is not None and not event.is_directory:
            if isinstance(event, FileClosedEvent):  # the sink writes by rename: a close there is someone else's
                self._sidecar_changed(inbox, source)
            self._consider(
                inbox,
                source,
                closed=isinstance(event, FileClosedEvent),
                wrote=isinstance(event, FileModifiedEvent),
            )

    def _sidecar_changed(self, inbox: _Inbox, path: Path) -> None:
        """A sidecar beside a submitted document was removed, moved away or written over: is it still done?"""
        document = self._sidecar_of(inbox, path)
        if document is not None:
            self._spawn(self._redo_lapsed(inbox, [document]))

    async def _scan_into(self, inbox: _Inbox, folder: Path, *, closed: bool) -> None:
        if not inbox.covers(folder):
            return
        try:
            found = await asyncio.to_thread(inbox.scan, folder)
        except OSError:
            return  # gone again; a later event or the reconciliation scan covers whatever is there
        self._take(inbox, found, closed=closed)

    def _take(self, inbox: _Inbox, found: dict[Path, Signature | str], *, closed: bool) -> None:
        for path, seen in found.items():
            if inbox.settled.get(path) == seen:
                continue
            if isinstance(seen, str):
                self._refuse(inbox, path, seen)
            else:
                self._consider(inbox, path, closed=closed)

    async def _refuse_folder_link(self, inbox: _Inbox, path: Path) -> None:
        """A link to a folder is refused as it appears, as the scan would refuse it (both watchers report a
        new link as a file: neither follows it)."""
        if not await self._blocking(lambda: os.path.islink(path) and os.path.isdir(path)):
            return
        with contextlib.suppress(SourceGone, OSError):
            try:
                await self._blocking(inspect_file, path, inbox.root)
            except NotARegularFile as exc:
                self._refuse(inbox, path, exc.message)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- readiness -----------------------------------------------------------------------------------------

    def _consider(self, inbox: _Inbox, path: Path, *, closed: bool = False, wrote: bool = False) -> None:
        """Follow ``path`` until it is whole; an event for a file already followed only updates what is known."""
        if self._submit is None or self._inboxes.get(inbox.root) is not inbox or not inbox.accepts(path):
            return
        pending = inbox.pending.get(path)
        if pending is None:
            pending = inbox.pending[path] = _Pending(path, inbox)
            pending.task = asyncio.create_task(self._settle(pending), name=f"settle {path}")
        pending.generation += 1
        if wrote:
            pending.reopened |= pending.closed
            pending.closed = False
        if closed:
            pending.closed = True
            pending.nudge.set()

    async def _settle(self, pending: _Pending) -> None:
        """Look at one file until it is whole, then submit it. A file still being written is never given up.

        Whole means: closed after writing (or moved in), or its signature (size, mtime, ctime, inode) unchanged
        for ``settle_seconds``; and then the probe passes. A close counts only for a new file whose writer never
        came back: a file rewritten, or appended by one open-write-close after another (an incremental PDF
        save), must be quiet for ``settle_seconds``, else each piece that ends in a valid trailer is taken. A
        file stable for long that still fails the probe is submitted anyway, so the renderer reports what is
        wrong with it. Writes do not wake this task (a busy writer would make it
        spin); the next look at the settle deadline sees them.
        """
        inbox = pending.inbox
        try:
            while inbox.accepts(pending.path):  # a reload may have changed the patterns
                generation = pending.generation
                pending.nudge.clear()
                signature: Signature | None = None
                try:
                    signature = await self._blocking(inspect_file, pending.path, inbox.root)
                except SourceGone:
                    pass
                except NotARegularFile as exc:
                    self._refuse(inbox, pending.path, exc.message)
                if signature is None or inbox.settled.get(pending.path) == signature:
                    if pending.generation == generation:
                        return
                    continue
                delay = await self._look(pending, signature)
                if delay is not None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(pending.nudge.wait(), delay)
        except OSError as exc:
            log.warning("local_inspect_failed", path=str(pending.path), error=str(exc))
        except Exception:  # submit failed, most likely: the reconciliation scan offers the file again
            log.exception("local_settle_failed", path=str(pending.path))
        finally:
            if inbox.pending.get(pending.path) is pending:
                del inbox.pending[pending.path]

    async def _look(self, pending: _Pending, signature: Signature) -> float | None:
        """One readiness decision: submit now (None: look once more) or how long to wait before the next look."""
        inbox, settle = pending.inbox, pending.inbox.config.settle_seconds
        now = time.monotonic()
        if signature != pending.signature:
            pending.signature, pending.stable_since = signature, now
        quiet = now - pending.stable_since
        rewritten = pending.reopened or isinstance(inbox.settled.get(pending.path), Signature)
        if (rewritten or not pending.closed) and quiet < settle:
            return settle - quiet
        complete = await self._blocking(probe, pending.path, inbox.root)
        if not complete and quiet < max(PROBE_GIVE_UP_SETTLES * settle, PROBE_GIVE_UP_MIN_SECONDS):
            return max(settle, RECHECK_MIN_SECONDS)
        try:
            after = await self._blocking(inspect_file, pending.path, inbox.root)
        except (SourceGone, NotARegularFile):
            return 0.0  # replaced while being probed: the next look says by what
        if after != signature:
            return 0.0  # it changed while being probed
        assert self._submit is not None
        await self._submit(self._job(inbox, pending.path, pending.detected_at))
        inbox.settled[pending.path] = signature
        log.info(
            "local_submitted",
            path=str(pending.path),
            inbox=str(inbox.root),
            bytes=signature.size,
            waited=round(time.time() - pending.detected_at, 3),
            probe="ok" if complete else "failed",
        )
        return None

    def _job(self, inbox: _Inbox, path: Path, detected_at: float | None = None) -> Job:
        config = inbox.config
        return Job(
            origin=LocalFile(path, inbox.root), source=self.name, priority=config.priority, prompt=config.prompt,
            max_bytes=config.max_bytes, max_pages=config.max_pages, detected_at=detected_at or time.time(),
        )  # fmt: skip

    def _refuse(self, inbox: _Inbox, path: Path, reason: str) -> None:
        inbox.settled[path] = reason
        if path not in inbox.refused:
            inbox.refused.add(path)
            log.warning("local_refused", path=str(path), reason=reason)

    async def _blocking(self, function: Callable[..., T], *args: Any) -> T:
        async with self._io:
            return await asyncio.to_thread(function, *args)


def _by_root(inboxes: Sequence[InboxConfig]) -> dict[Path, InboxConfig]:
    """Inbox configs by resolved folder; two sections for one folder is a configuration error."""
    by_root: dict[Path, InboxConfig] = {}
    for index, config in enumerate(inboxes):
        root = config.path.expanduser().resolve()
        if root in by_root:
            raise ConfigError(f"inbox[{index}].path: {root} is already watched by another [[inbox]]")
        by_root[root] = config
    return by_root
