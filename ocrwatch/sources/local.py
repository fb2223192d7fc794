"""Local inbox folders as a source: watchdog events plus scans, and a file is submitted only once it
is whole.

Each ``[[inbox]]`` gets its own watcher (``watch`` chooses inotify or polling), which hands its
events over in batches (``watch.EventBridge``), watches no deeper than the inbox's ``max_depth``,
and is replaced when it dies: at once when its thread says so, within ``WATCH_CHECK_SECONDS`` when a
thread ends without a word; no fault of one inbox stops the start or the other inboxes. The
folders a native watcher leaves unwatched for its bound (``[[inbox]] max_watches``) are scanned
every ``poll_seconds`` instead, and one line says the bound was reached. Events only say *where
to look*: a scan at start and every ``reconcile_seconds`` finds what events missed, and
every candidate passes the same readiness check (``settling``: closed or stable, then the probe)
before ``submit``. A document submitted before is submitted again, and so redone, once its sidecars
are gone or no longer its own while its ledger row says done: a question put to the layer above
through the outbox (``Outbox.lapsed``), which answers with the documents that lapsed; asked as soon
as an event names one of its sidecars, and of every unchanged document at each scan, at the cost of
a ledger read and a sidecar's head, never a hash. Every stat, probe and scan runs in
a worker thread, so the loop never blocks on a slow filesystem, and nothing is opened before
``lstat`` says it is a regular file, so a FIFO cannot hang a reader. No link is followed, to a file
or to a folder, inside the inbox or out of it: each is refused with one log line (``sourcefile``).

Concurrency: all methods are called from the event loop; ``stop`` once, after ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any

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

from ocrwatch.config import InboxConfig
from ocrwatch.errors import (
    ConfigError,
    NotARegularFile,
    SourceGone,
    quarantined,
)
from ocrwatch.infra.metrics import Metrics
from ocrwatch.naming import sidecar_names
from ocrwatch.sources.base import Fetched, Job, LocalFile, Outbox, Outcome, Quarantine, Read
from ocrwatch.sources.ignore import sidecar_suffixes
from ocrwatch.sources.inbox import Inbox
from ocrwatch.sources.settling import Settler, standing
from ocrwatch.sources.sourcefile import fetch_copy, inspect
from ocrwatch.sources.watch import Batch, EventBridge, Watcher, start_watcher

log = structlog.get_logger()

WATCH_CHECK_SECONDS = 2.0
"""How often every watcher's threads are checked: one that ended unannounced is found this soon."""
RESTART_BACKOFF_MAX_SECONDS = 60.0
STEADY_SECONDS = 60.0
"""A watcher that ran this long before it died is restarted at once: it did not die of starting."""
OVERFLOW_LOG_SECONDS = 60.0
BEYOND_PAUSE = 9.0
"""After a scan of the folders beyond the watch bound, the next waits at least this many times as
long as it took (or ``poll_seconds``, if longer): however many folders a user makes, polling them
takes a tenth of the time at most."""


# --- the source -----------------------------------------------------------------------------------


class LocalSource:
    """Watches local inbox folders and submits each document once it is completely written."""

    name = "local"

    def __init__(
        self,
        inboxes: Sequence[InboxConfig],
        *,
        reconcile_seconds: float,
        name_template: str,
        metrics: Metrics | None = None,
    ) -> None:
        """``metrics``: where watcher restarts and dropped events are counted."""
        self._reconcile_seconds = reconcile_seconds
        self._metrics = metrics
        self._name_template = name_template
        self._ignored = sidecar_suffixes(name_template)
        self._inboxes = {
            root: Inbox(root, config, self._ignored) for root, config in _by_root(inboxes).items()
        }
        self._outbox: Outbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciler: asyncio.Task[None] | None = None
        self._checker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._settler = Settler(self.name, self.finish)
        self._bounded: set[Path] = set()  # inboxes whose watch bound was said to be reached

    async def start(self, outbox: Outbox) -> None:
        """Watch every inbox, then scan it (in that order, so nothing slips between), then reconcile
        periodically.

        ``outbox.reject`` is never called: a file is only ever submitted, even one that never passes
        the probe, so that the pipeline names its defect.
        """
        self._outbox, self._loop = outbox, asyncio.get_running_loop()
        self._settler.start(outbox)
        async with self._lock:
            for inbox in self._inboxes.values():
                await self._refresh_guarded(inbox)
        self._reconciler = asyncio.create_task(self._reconcile_forever(), name="local-reconcile")
        self._checker = asyncio.create_task(
            self._check_watchers_forever(), name="local-watch-check"
        )

    async def stop(self) -> None:
        """Stop observers and drop files still settling: the scan at the next start finds them
        again."""
        self._outbox = None
        tasks = [*self._background]
        tasks += [task for task in (self._reconciler, self._checker) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, self._settler.stop(), return_exceptions=True)
        for inbox in self._inboxes.values():
            inbox.pending.clear()
            self._settler.say_unchanged(inbox)
        await asyncio.gather(*(self._unwatch(inbox) for inbox in self._inboxes.values()))

    async def update_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """Apply a reloaded config: watch new inboxes, forget removed ones, re-watch changed ones.

        Files settling in an inbox that stays are kept. Raises ``ConfigError`` before changing
        anything when two inboxes name the same folder.
        """
        wanted = _by_root(inboxes)
        async with self._lock:
            for root in self._inboxes.keys() - wanted.keys():
                retired = self._inboxes.pop(root)
                for pending in retired.pending.values():
                    self._settler.discard(pending)
                retired.pending.clear()
                await self._unwatch(retired)
                log.info("inbox_removed", path=str(root))
            for root, config in wanted.items():
                inbox = self._inboxes.get(root)
                if inbox is None:
                    inbox = self._inboxes[root] = Inbox(root, config, self._ignored)
                elif inbox.config != config:
                    inbox.configure(config)
                    await self._unwatch(inbox)
                else:
                    continue
                if self._outbox is not None:
                    await self._refresh(inbox)

    def inboxes(self) -> dict[Path, InboxConfig]:
        """The inboxes watched now (a reload changes them), by resolved folder."""
        return {root: inbox.config for root, inbox in self._inboxes.items()}

    async def fetch(self, job: Job, spool_dir: Path, read: Read | None = None) -> Fetched:
        """Open the file once, beneath its inbox and without following links, and copy it through
        that descriptor into the spool folder while hashing it (unless ``read``, admission's hash,
        was taken under the signature it is copied under): what is rendered is what was checked
        and hashed."""
        origin = job.origin
        if not isinstance(origin, LocalFile):
            raise TypeError(f"LocalSource cannot fetch {origin!r}")
        return await asyncio.to_thread(
            fetch_copy, origin.path, origin.inbox, spool_dir, job.max_bytes, read
        )

    async def finish(
        self, job: Job, outcome: Outcome, kind: str | None = None
    ) -> Quarantine | None:
        """Ask for a document failed as ``kind`` to be moved to its inbox's ``quarantine_dir`` where
        one is set, the kind is one it takes (``errors.quarantined``) and no new version is being
        written (``Quarantine``: the layer above moves it, ``jobs.quarantine``); otherwise leave it
        be (None). Called by the layer above once a job ran or was answered settled, and by the
        settler for ``submit``'s answer that settled one."""
        origin = job.origin
        inbox = self._inboxes.get(origin.inbox) if isinstance(origin, LocalFile) else None
        comes_back = standing(outcome, kind) != outcome  # failed for what its path was then
        if comes_back and inbox is not None and isinstance(origin, LocalFile):
            # Failed for what its path was then: the next scan finding it whole submits it again.
            inbox.settled.forget(origin.path)
        if outcome != "failed" or inbox is None or inbox.quarantine is None:
            return None
        assert isinstance(origin, LocalFile)
        if not quarantined(kind):
            reason = f"{kind} is no fault of the document's own: it stays for its hint's fix"
            log.info("local_quarantine_skipped", path=str(origin.path), reason=reason)
            return None
        pending = inbox.pending.get(str(origin.path))
        if pending is not None and not inbox.settled.matches(origin.path, pending.signature):
            log.info(
                "local_quarantine_skipped",
                path=str(origin.path),
                reason="a new version is being written",
            )
            return None
        return Quarantine(origin.path, origin.inbox, inbox.quarantine, self._name_template)

    # --- watching ---------------------------------------------------------------------------------

    async def _refresh(self, inbox: Inbox) -> None:
        """Make sure the inbox is watched (again, if its folder was replaced or remounted), then
        scan it."""
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
        inbox.settled.keep_only(found)
        inbox.refused = {path for path in inbox.refused if isinstance(found.get(path), str)}
        unchanged = [Path(key) for key, seen in found.items() if inbox.settled.matches(key, seen)]
        await self._redo_lapsed(inbox, unchanged)

    async def _redo_lapsed(self, inbox: Inbox, paths: Iterable[Path]) -> None:
        """Submit again those of ``paths`` that were submitted, are not being looked at, and whose
        sidecars have lapsed: one question to the layer above for them all."""
        settled, pending, outbox = inbox.settled, inbox.pending, self._outbox
        asked = [path for path in paths if settled.submitted(path) and str(path) not in pending]
        if not asked or outbox is None:
            return
        try:
            jobs = await outbox.lapsed([self._settler.job(inbox, path) for path in asked])
        except Exception:  # the ledger busy or closing: the next scan asks again
            log.exception("local_lapsed_check_failed", inbox=str(inbox.root))
            return
        for path in (job.origin.path for job in jobs if isinstance(job.origin, LocalFile)):
            if self._inboxes.get(inbox.root) is inbox and path in inbox.settled:
                log.info("local_sidecars_lapsed", path=str(path), inbox=str(inbox.root))
                inbox.settled.forget(path)
                self._consider(inbox, path, closed=True)

    def _sidecar_of(self, inbox: Inbox, path: Path) -> Path | None:
        """The submitted document whose Markdown or JSON sidecar ``path`` names, beside it; None for
        any other file (looked for only when such a name goes away or is written over, which is
        rare)."""
        if not path.name.endswith((".md", ".json")):
            return None
        for document in inbox.settled.submitted_in(path.parent):
            names = sidecar_names(document.name, self._name_template)
            if path.name in (names["md"], names["json"]):
                return document
        return None

    async def _watch(self, inbox: Inbox) -> None:
        assert self._loop is not None
        bridge: EventBridge

        def deliver(batch: Batch) -> None:
            self._on_batch(inbox, bridge, batch)

        bridge = EventBridge(self._loop, deliver)
        watcher, polling, reason = await asyncio.to_thread(
            start_watcher,
            inbox.root,
            inbox.max_depth,
            inbox.allows,
            inbox.config.polling,
            bridge,
            inbox.config.poll_seconds,
            inbox.config.max_watches,
        )
        inbox.observer, inbox.bridge, inbox.watched_since = watcher, bridge, time.monotonic()
        if not polling:
            self._spawn(self._scan_beyond_forever(inbox, watcher))
        if self._metrics is not None:  # every inbox's series, zero until something happens
            self._metrics.inbox_watcher_restarts.labels(inbox=str(inbox.root))
            self._metrics.inbox_event_overflows.labels(inbox=str(inbox.root))
        log.info(
            "inbox_watching",
            path=str(inbox.root),
            observer="polling" if polling else "native",
            reason=reason,
            recursive=inbox.config.recursive,
            max_depth=inbox.max_depth,
        )

    async def _scan_beyond_forever(self, inbox: Inbox, watcher: Watcher) -> None:
        """Every ``poll_seconds`` (or longer: ``BEYOND_PAUSE``) while ``watcher`` watches
        ``inbox``: scan the folders it leaves unwatched for its bound, in one worker thread, for
        what events would have named there; the first time there are any, say once that the bound
        is reached."""
        took = 0.0
        while True:
            await asyncio.sleep(max(inbox.config.poll_seconds, BEYOND_PAUSE * took))
            if inbox.observer is not watcher or self._inboxes.get(inbox.root) is not inbox:
                return  # replaced, or the inbox retired: its successor polls
            folders = watcher.beyond()
            if not folders:
                continue
            if inbox.root not in self._bounded:
                self._bounded.add(inbox.root)
                log.warning(
                    "inbox_watches_bounded",
                    path=str(inbox.root),
                    max_watches=inbox.config.max_watches,
                    polled=len(folders),
                    poll_seconds=inbox.config.poll_seconds,
                )
            started = time.monotonic()
            found = await asyncio.to_thread(_scan_all, inbox, folders)
            took = time.monotonic() - started
            if inbox.observer is watcher:
                self._take(inbox, found, closed=False)

    async def _unwatch(self, inbox: Inbox) -> None:
        observer, inbox.observer, inbox.identity, inbox.bridge = inbox.observer, None, None, None
        if observer is not None:
            await asyncio.to_thread(observer.stop)

    async def _refresh_guarded(self, inbox: Inbox) -> None:
        """``_refresh``, where no fault of one inbox, whatever it is, stops the start or the other
        inboxes."""
        try:
            await self._refresh(inbox)
        except Exception:
            log.exception("inbox_refresh_failed", path=str(inbox.root))

    async def _reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(self._reconcile_seconds)
            async with self._lock:
                for inbox in list(self._inboxes.values()):
                    await self._refresh_guarded(inbox)

    async def _check_watchers_forever(self) -> None:
        """A watcher whose thread ended unannounced (watchdog's poller can) is found within
        seconds."""
        while True:
            await asyncio.sleep(WATCH_CHECK_SECONDS)
            for inbox in list(self._inboxes.values()):
                if (
                    inbox.observer is not None
                    and not inbox.restarting
                    and not inbox.observer.alive()
                ):
                    self._watcher_died(inbox, "a thread of the watcher ended")

    def _watcher_died(self, inbox: Inbox, reason: str) -> None:
        """Start a new watcher for ``inbox``, at once unless its watchers keep dying as soon as they
        start."""
        if inbox.restarting or self._outbox is None:
            return
        inbox.restarting = True
        inbox.deaths = (
            1 if time.monotonic() - inbox.watched_since > STEADY_SECONDS else inbox.deaths + 1
        )
        delay = min(2.0 ** (inbox.deaths - 1) - 1, RESTART_BACKOFF_MAX_SECONDS)
        log.warning("inbox_watcher_died", path=str(inbox.root), reason=reason, restart_in=delay)
        self._spawn(self._restart(inbox, delay))

    async def _restart(self, inbox: Inbox, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            async with self._lock:
                if self._outbox is None or self._inboxes.get(inbox.root) is not inbox:
                    return
                if self._metrics is not None:
                    self._metrics.inbox_watcher_restarts.labels(inbox=str(inbox.root)).inc()
                await self._unwatch(inbox)
                await self._refresh_guarded(inbox)
        finally:
            inbox.restarting = False
        if inbox.observer is not None:
            log.info("inbox_watcher_restarted", path=str(inbox.root))

    def _on_batch(self, inbox: Inbox, bridge: EventBridge, batch: Batch) -> None:
        """On the loop: what one watcher said since the last batch, in the order it said it."""
        if (
            self._outbox is None
            or self._inboxes.get(inbox.root) is not inbox
            or inbox.bridge is not bridge
        ):
            # stopped, or from a watcher since replaced (its successor's scan covers what it saw)
            return
        for event in batch.events:
            self._on_event(inbox, event)
        if batch.overflowed:
            self._overflowed(inbox)
        if batch.died is not None:
            self._watcher_died(inbox, batch.died)

    def _overflowed(self, inbox: Inbox) -> None:
        """Events were dropped (by the kernel, or waiting for a busy loop): one scan, however many
        batches say so meanwhile, finds what they named; logged at most once a minute, counted
        always."""
        if self._metrics is not None:
            self._metrics.inbox_event_overflows.labels(inbox=str(inbox.root)).inc()
        inbox.overflows_unlogged += 1
        if time.monotonic() - inbox.overflow_logged_at >= OVERFLOW_LOG_SECONDS:
            log.warning(
                "inbox_events_overflowed", path=str(inbox.root), times=inbox.overflows_unlogged
            )
            inbox.overflow_logged_at, inbox.overflows_unlogged = time.monotonic(), 0
        if inbox.rescanning:
            inbox.rescan_again = True
            return
        inbox.rescanning = True
        self._spawn(self._rescan(inbox))

    async def _rescan(self, inbox: Inbox) -> None:
        try:
            while True:
                inbox.rescan_again = False
                await self._scan_into(inbox, inbox.root, closed=False)
                if not inbox.rescan_again:
                    return
        finally:
            inbox.rescanning = False

    def _on_event(self, inbox: Inbox, event: FileSystemEvent) -> None:
        """On the loop: turn one watchdog event into a file to look at (or a folder to scan)."""
        source = Path(os.fsdecode(event.src_path)) if event.src_path else None
        target = Path(os.fsdecode(event.dest_path)) if event.dest_path else None
        if isinstance(event, DirCreatedEvent) and source is not None:
            self._spawn(self._scan_into(inbox, source, closed=False))
        elif isinstance(event, DirMovedEvent) and target is not None:
            # Files inside a moved-in folder emit no events of their own; they were whole when
            # moved.
            self._spawn(self._scan_into(inbox, target, closed=True))
        elif isinstance(event, (FileMovedEvent, FileDeletedEvent)):
            if source is not None:
                inbox.settled.forget(source)
                self._sidecar_changed(inbox, source)
            if target is not None:
                self._consider(inbox, target, closed=True)
        elif (
            isinstance(event, FileCreatedEvent) and source is not None and not inbox.accepts(source)
        ):
            if inbox.covers(source.parent):
                if not inbox.link_checks:
                    self._spawn(self._refuse_folder_links(inbox))
                inbox.link_checks.add(source)
        elif source is not None and not event.is_directory:
            # the sink writes by rename: a close there is someone else's
            if isinstance(event, FileClosedEvent):
                self._sidecar_changed(inbox, source)
            self._consider(
                inbox,
                source,
                closed=isinstance(event, FileClosedEvent),
                wrote=isinstance(event, FileModifiedEvent),
            )

    def _sidecar_changed(self, inbox: Inbox, path: Path) -> None:
        """A sidecar beside a submitted document was removed, moved away or written over: is it
        still done?"""
        document = self._sidecar_of(inbox, path)
        if document is not None:
            self._spawn(self._redo_lapsed(inbox, [document]))

    async def _scan_into(self, inbox: Inbox, folder: Path, *, closed: bool) -> None:
        if not inbox.allows(folder):  # a folder too deep is the scan's to refuse
            return
        try:
            found = await asyncio.to_thread(inbox.scan, folder)
        except OSError:
            return  # gone again; a later event or the reconciliation scan covers whatever is there
        self._take(inbox, found, closed=closed)

    def _take(self, inbox: Inbox, found: dict[str, bytes | str], *, closed: bool) -> None:
        for key, seen in found.items():
            if inbox.settled.matches(key, seen):
                continue
            if isinstance(seen, str):
                self._settler.refuse(inbox, Path(key), seen)
            else:
                self._consider(inbox, Path(key), closed=closed)

    async def _refuse_folder_links(self, inbox: Inbox) -> None:
        """A link to a folder is refused as it appears, as the scan would refuse it (both watchers
        report a new link as a file: neither follows it). The names created meanwhile are looked at
        together, in one worker thread: an event storm of new files costs one task, not one each."""
        await asyncio.sleep(0)  # the rest of this batch's names join the set first
        paths, inbox.link_checks = inbox.link_checks, set()

        def refusals() -> list[tuple[Path, str]]:
            found = []
            for path in paths:
                with contextlib.suppress(SourceGone, OSError):
                    try:
                        if os.path.islink(path) and os.path.isdir(path):
                            inspect(path, inbox.root)
                    except NotARegularFile as exc:
                        found.append((path, exc.message))
            return found

        for path, reason in await self._settler.blocking(refusals):
            self._settler.refuse(inbox, path, reason)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _consider(
        self, inbox: Inbox, path: Path, *, closed: bool = False, wrote: bool = False
    ) -> None:
        """Have ``path`` followed until whole, unless stopped, its inbox retired or not its name."""
        if (
            self._outbox is None
            or self._inboxes.get(inbox.root) is not inbox
            or not inbox.accepts(path)
        ):
            return
        self._settler.follow(inbox, path, closed=closed, wrote=wrote)


def _scan_all(inbox: Inbox, folders: Iterable[str]) -> dict[str, bytes | str]:
    """What ``Inbox.scan`` finds under each of ``folders`` (blocking); a folder gone meanwhile is
    passed over: the event of its removal drops it from the watcher's list."""
    found: dict[str, bytes | str] = {}
    for folder in folders:
        with contextlib.suppress(OSError):
            found.update(inbox.scan(Path(folder)))
    return found


def _by_root(inboxes: Sequence[InboxConfig]) -> dict[Path, InboxConfig]:
    """Inbox configs by resolved folder; two sections for one folder is a configuration error."""
    by_root: dict[Path, InboxConfig] = {}
    for index, config in enumerate(inboxes):
        root = config.path.expanduser().resolve()
        if root in by_root:
            raise ConfigError(
                f"inbox[{index}].path: {root} is already watched by another [[inbox]]"
            )
        by_root[root] = config
    return by_root
