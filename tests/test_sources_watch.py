"""Watching an inbox that users may fill with anything (issue 24, items 7 and 8): a chain of folders
2,500 deep neither stops the start nor deafens a watcher, a watcher that dies is replaced, and
events reach the loop in batches that wake it once each, so that a signal is never crowded out.

The LocalSource tests run real watchers on real folders, as ``test_sources_local`` does, with its
helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import ValidationError
from watchdog.events import FileCreatedEvent, FileSystemEventHandler
from watchdog.observers.polling import PollingEmitter

from ocrwatch.app.daemon import SignalCatcher
from ocrwatch.config import InboxConfig
from ocrwatch.infra.metrics import Metrics
from ocrwatch.sources import inotify, local
from ocrwatch.sources.inotify import InotifyWatcher
from ocrwatch.sources.local import LocalSource
from ocrwatch.sources.tree import walk
from ocrwatch.sources.watch import Batch, EventBridge, PollingWatcher, start_watcher
from tests.support.chains import make_chain, remove_chain
from tests.support.outboxes import fed
from tests.test_sources_local import PDF, Collector, inbox, never_reject, run, until, watching

DEEP = 2500  # the chain: more than twice what a recursive walk survives on Python 3.11
NAME = "d"
LONG = "d" * 130  # 32 of these make a path longer than PATH_MAX


@pytest.fixture(scope="module")
def chain_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the module's one chain waits between tests (a folder operation costs milliseconds on a
    busy disk: the chain is made once, and each test renames it in and back), with a document 32
    levels deep and one 33."""
    home = tmp_path_factory.mktemp("chain")
    make_chain(home, DEEP, NAME, files={32: ("deepest.pdf", PDF), 33: ("too-deep.pdf", PDF)})
    yield home
    remove_chain(home, NAME)


@contextlib.contextmanager
def chain_in(home: Path, folder: Path) -> Iterator[Path]:
    """The chain in ``folder`` for the block, then back home."""
    os.rename(home / NAME, folder / NAME)
    try:
        yield folder / NAME
    finally:
        os.rename(folder / NAME, home / NAME)


def open_descriptors() -> set[str]:
    """The numbers of this process's open descriptors: compared as sets, so one another thread
    closes meanwhile cannot hide one the walk left open."""
    return set(os.listdir("/proc/self/fd"))


def refusals(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "local_refused"]


# --- the walk -------------------------------------------------------------------------------------


def test_the_walk_goes_2400_levels_deep_past_path_max_on_two_descriptors(
    tmp_path: Path, chain_home: Path
) -> None:
    (tmp_path / "link").symlink_to(tmp_path / NAME)
    with chain_in(chain_home, tmp_path):
        before, most = open_descriptors(), 0
        listings = []
        for listing in walk(tmp_path, tmp_path, 2400, lambda folder: True):
            most = max(most, len(open_descriptors() - before))
            listings.append(listing)
    assert [listing.depth for listing in listings] == list(range(2401))
    assert listings[0].folder_links == listings[0].files == ("link",)
    assert listings[32].files == ("deepest.pdf",) and len(str(listings[2400].folder)) > 4096
    assert listings[2400].too_deep == (NAME,) and all(
        not listing.too_deep for listing in listings[:2400]
    )
    assert most <= 2 and not open_descriptors() - before, (
        "a chain holds two descriptors, all closed at the end"
    )


def test_a_document_whose_path_is_longer_than_path_max_is_taken(tmp_path: Path) -> None:
    """Before: ``os.walk`` lists a folder by its path, which fails with ``ENAMETOOLONG`` past
    ``PATH_MAX``."""
    root = tmp_path / "in"
    root.mkdir()
    make_chain(root, 33, LONG, files={32: ("deepest.pdf", PDF), 33: ("too-deep.pdf", PDF)})

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            async with watching(inbox(root)) as (_, got):
                await until(lambda: got.names() == {"deepest.pdf"}, "deepest.pdf")
                assert len(str(got.paths()[0])) > 4096
                await until(lambda: refusals(logs), "the folder too deep refused")
        assert len(refusals(logs)) == 1

    try:
        run(scenario())
    finally:
        remove_chain(root, LONG)


def test_max_depth_is_bounded_as_watchdogs_poller_needs() -> None:
    assert InboxConfig().max_depth == 32
    for wrong in (0, 257):
        with pytest.raises(ValidationError):
            InboxConfig(max_depth=wrong)


# --- a deep chain at start and while watching -----------------------------------------------------


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
def test_a_chain_2500_deep_present_at_start_stops_neither_the_start_nor_the_rest(
    tmp_path: Path, chain_home: Path, polling: bool
) -> None:
    """Before: ``RecursionError`` out of ``start`` (watchdog's recursive walk adding watches, or
    taking the poller's first snapshot), which made the daemon exit 1 at every start."""
    root = tmp_path / "in"
    root.mkdir()

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            collector = Collector()
            source = LocalSource(
                [inbox(root, polling=polling)], reconcile_seconds=60, name_template="{name}"
            )
            await source.start(fed(collector, never_reject))
            try:
                (root / "top.pdf").write_bytes(PDF)
                await until(
                    lambda: collector.names() == {"deepest.pdf", "top.pdf"},
                    "top.pdf and deepest.pdf",
                )
            finally:
                await source.stop()
        deep = root.resolve().joinpath(*[NAME] * 33)
        assert [
            (entry["path"], "max_depth = 32" in entry["reason"]) for entry in refusals(logs)
        ] == [(str(deep), True)], "one line for the folder too deep, nothing below it"
        assert not [entry for entry in logs if entry["log_level"] in ("error", "critical")]

    with chain_in(chain_home, root):
        run(scenario())


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
def test_a_chain_2500_deep_moved_in_while_watching_leaves_the_watcher_hearing(
    tmp_path: Path, chain_home: Path, polling: bool
) -> None:
    """Before: the watcher's thread died of ``RecursionError`` without a word (watchdog's
    ``InotifyFD`` reader or the poller's emitter) and no later file was noticed until a
    reconciliation scan."""
    root = tmp_path / "in"
    root.mkdir()

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            collector = Collector()
            source = LocalSource(
                [inbox(root, polling=polling)], reconcile_seconds=60, name_template="{name}"
            )
            await source.start(fed(collector, never_reject))
            try:
                os.rename(chain_home / NAME, root / NAME)
                # its events come after the move's, whichever the watcher
                (root / "after.pdf").write_bytes(PDF)
                await until(
                    lambda: {"after.pdf", "deepest.pdf"} <= collector.names(),
                    "after.pdf, by an event",
                )
                await until(lambda: refusals(logs), "the folder too deep refused")
                assert source._inboxes[root.resolve()].observer.alive()
            finally:
                await source.stop()
        assert len(refusals(logs)) == 1 and "too-deep.pdf" not in collector.names()
        assert not [entry for entry in logs if entry["event"] == "inbox_watcher_died"]

    try:
        run(scenario())
    finally:
        if (root / NAME).exists():
            os.rename(root / NAME, chain_home / NAME)


def test_the_native_watcher_watches_max_depth_levels_and_no_more(
    tmp_path: Path, chain_home: Path
) -> None:
    with chain_in(chain_home, tmp_path):
        watcher = InotifyWatcher(
            tmp_path, 5, lambda folder: True, FileSystemEventHandler(), died=print, overflowed=print
        )
        watcher.start()
        try:
            assert watcher.watched == 6  # the inbox and five levels below it
        finally:
            watcher.stop()
    assert not watcher.alive()


# --- watchers that die ----------------------------------------------------------------------------


def restarts(metrics: Metrics, root: Path) -> float | None:
    return metrics.registry.get_sample_value(
        "ocrwatch_inbox_watcher_restarts_total", {"inbox": str(root)}
    )


# the injected death
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
def test_a_watcher_that_dies_is_replaced_with_a_log_line_and_a_metric(
    tmp_path: Path, polling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection where each watcher's thread works: the native one's event handling, the
    poller's emitter (whose death watchdog's observer thread outlives). Before: the inbox stayed
    deaf until restarted by hand."""
    root = tmp_path / "in"
    root.mkdir()
    broken = threading.Event()

    def fail_once(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (root / "boom.pdf").exists() and not broken.is_set():
                broken.set()
                raise RuntimeError("injected fault")
            return original(self, *args, **kwargs)

        return wrapper

    if polling:
        monkeypatch.setattr(PollingEmitter, "queue_events", fail_once(PollingEmitter.queue_events))
    else:
        monkeypatch.setattr(InotifyWatcher, "_handle", fail_once(InotifyWatcher._handle))
    monkeypatch.setattr(local, "WATCH_CHECK_SECONDS", 0.2, raising=False)

    async def scenario() -> None:
        metrics = Metrics()
        with structlog.testing.capture_logs() as logs:
            collector = Collector()
            source = LocalSource(
                [inbox(root, polling=polling)],
                reconcile_seconds=60,
                name_template="{name}",
                metrics=metrics,
            )
            await source.start(fed(collector, never_reject))
            try:
                assert restarts(metrics, root.resolve()) == 0
                (root / "boom.pdf").write_bytes(PDF)
                await until(
                    lambda: any(e["event"] == "inbox_watcher_restarted" for e in logs), "a restart"
                )
                (root / "after.pdf").write_bytes(PDF)
                await until(
                    lambda: "after.pdf" in collector.names(), "after.pdf, seen by the new watcher"
                )
            finally:
                await source.stop()
        died = [entry for entry in logs if entry["event"] == "inbox_watcher_died"]
        assert len(died) == 1 and died[0]["restart_in"] == 0
        assert (
            "injected fault" in died[0]["reason"]
            or "thread of the watcher ended" in died[0]["reason"]
        )
        assert restarts(metrics, root.resolve()) == 1

    run(scenario())


def test_an_inbox_folder_removed_while_watched_is_watched_again_once_recreated(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            source = LocalSource([inbox(root)], reconcile_seconds=60, name_template="{name}")
            collector = Collector()
            await source.start(fed(collector, never_reject))
            try:
                root.rmdir()
                await until(
                    lambda: any(e["event"] == "inbox_watcher_restarted" for e in logs),
                    "a new watcher",
                )
                # the restart made the folder again (create = true)
                (root / "back.pdf").write_bytes(PDF)
                await until(lambda: collector.names() == {"back.pdf"}, "back.pdf")
            finally:
                await source.stop()

    run(scenario())


class WatchLimit:
    """libc, but ``inotify_add_watch`` fails as at the kernel's watch limit (``ENOSPC``) after
    ``allowed`` calls."""

    def __init__(self, libc: Any, allowed: int) -> None:
        self._libc, self.allowed = libc, allowed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._libc, name)

    def inotify_add_watch(self, fd: int, path: bytes, mask: int) -> int:
        if self.allowed <= 0:
            ctypes.set_errno(errno.ENOSPC)
            return -1
        self.allowed -= 1
        return int(self._libc.inotify_add_watch(fd, path, mask))


def test_the_inotify_watch_limit_reached_while_watching_hands_the_inbox_to_the_poller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that cannot be watched would be a deaf corner of the inbox: the watcher gives way to
    a poller."""
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    monkeypatch.setattr(inotify, "_libc", WatchLimit(inotify._libc, allowed=2))

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            async with watching(inbox(root)) as (_, got):
                (root / "b").mkdir()  # the third watch: refused
                await until(
                    lambda: any(e["event"] == "inbox_watcher_restarted" for e in logs),
                    "a new watcher",
                )
                (root / "b" / "late.pdf").write_bytes(PDF)
                await until(lambda: got.names() == {"late.pdf"}, "late.pdf, polled")
        watching_logs = [entry for entry in logs if entry["event"] == "inbox_watching"]
        assert [entry["observer"] for entry in watching_logs] == ["native", "polling"]
        assert watching_logs[1]["reason"].startswith("inotify limit reached")
        died = [entry for entry in logs if entry["event"] == "inbox_watcher_died"]
        assert len(died) == 1 and "No space left on device" in died[0]["reason"]

    run(scenario())


# --- events to the loop: batches ------------------------------------------------------------------


def test_events_reach_the_loop_in_batches_that_wake_it_once_each() -> None:
    """Before: one ``call_soon_threadsafe`` per event, each a byte in the loop's self-pipe, the pipe
    a signal's byte must get through."""
    loop = asyncio.new_event_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe

    def counted(*args: Any) -> Any:
        wakes.append(args)
        return real(*args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    batches: list[Batch] = []
    bridge = EventBridge(loop, batches.append, limit=100)
    events = [FileCreatedEvent(f"/in/{index}.pdf") for index in range(60)]

    def storm(count: int) -> None:
        # each twice in a row
        for event in [event for event in events for _ in range(2)][: 2 * count]:
            bridge.dispatch(event)

    try:
        thread = threading.Thread(target=storm, args=(60,))
        thread.start()
        thread.join()
        loop.run_until_complete(asyncio.sleep(0.01))
        assert len(wakes) == 1 and len(batches) == 1
        assert batches[0].events == events and not batches[0].overflowed, (
            "a run of identical events is one"
        )

        for index in range(150):
            bridge.dispatch(FileCreatedEvent(f"/in/more-{index}.pdf"))
        loop.run_until_complete(asyncio.sleep(0.01))
        assert len(wakes) == 2 and batches[1].overflowed and batches[1].events == [], (
            "past the limit: a scan"
        )

        bridge.died("gone")
        bridge.dispatch(events[0])
        loop.run_until_complete(asyncio.sleep(0.01))
        assert len(wakes) == 3 and batches[2] == Batch([events[0]], overflowed=False, died="gone")
    finally:
        loop.close()
    # after the loop closed: dropped, never raised into the watcher's thread
    bridge.dispatch(events[1])


def test_a_signal_is_caught_while_the_loops_self_pipe_is_full() -> None:
    """Before (``loop.add_signal_handler``): the signal's byte went into the self-pipe a flood of
    ``call_soon_threadsafe`` had filled, was dropped, and the signal with it."""
    loop = asyncio.new_event_loop()
    caught: list[signal.Signals] = []
    before = signal.getsignal(signal.SIGHUP)

    async def scenario() -> None:
        catcher = SignalCatcher(loop, caught.append)
        catcher.install()
        try:
            flood = threading.Thread(
                target=lambda: [loop.call_soon_threadsafe(int) for _ in range(20_000)]
            )
            flood.start()
            flood.join()  # on the loop's thread: nothing reads the self-pipe meanwhile
            self_pipe = getattr(loop, "_csock", None)
            if self_pipe is not None:
                with pytest.raises(BlockingIOError):
                    self_pipe.send(b"\0")  # full, as an event storm leaves it
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.2)
        finally:
            catcher.uninstall()

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert caught == [signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is before, "the handler found at install is back"


def test_a_polled_inbox_is_looked_at_every_poll_seconds(tmp_path: Path) -> None:
    """``[[inbox]] poll_seconds`` reaches the poller (watchdog's ``timeout``: its wait between two
    looks)."""

    async def main() -> tuple[Any, bool]:
        bridge = EventBridge(asyncio.get_running_loop(), lambda batch: None)
        watcher, polling, _ = await asyncio.to_thread(
            start_watcher, tmp_path, 0, lambda p: True, True, bridge, 0.25, 8192
        )
        try:
            assert isinstance(watcher, PollingWatcher)
            return watcher.observer.timeout, polling
        finally:
            await asyncio.to_thread(watcher.stop)

    assert asyncio.run(main()) == (0.25, True)


# --- the watch bound ------------------------------------------------------------------------------


def inotify_watches(pid: int | str = "self") -> int:
    """The inotify watches a process holds, as the kernel counts them (one ``inotify wd:`` line per
    watch in the fdinfo of each inotify descriptor)."""
    watches = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == "anon_inode:inotify":
                info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
                watches += sum(line.startswith("inotify wd:") for line in info.splitlines())
    return watches


def wait_for(predicate: Any, what: str) -> None:
    """A watcher thread's answer, polled: it handles the kernel's events on its own time."""
    for _ in range(500):
        if predicate():
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_native_watcher_takes_at_most_max_watches_and_names_the_folders_beyond(
    tmp_path: Path,
) -> None:
    """Before: one watch a folder, however many a user makes (20,001 for 20,000 empty folders).
    Now at most ``max_watches``; every other folder lies at or below one that ``beyond`` names,
    and none it names lies below another. A folder made later beyond the bound is named, one
    removed is no longer."""
    for name in "abcdefghij":
        (tmp_path / name / "inner").mkdir(parents=True)
    before = inotify_watches()
    watcher = InotifyWatcher(
        tmp_path,
        5,
        lambda folder: True,
        FileSystemEventHandler(),
        died=print,
        overflowed=print,
        max_watches=4,
    )
    watcher.start()
    try:
        assert watcher.watched == 4 and inotify_watches() - before == 4
        beyond = [Path(folder) for folder in watcher.beyond()]
        watched = {Path(folder) for folder in watcher._watches}
        every = {tmp_path, *tmp_path.glob("*"), *tmp_path.glob("*/inner")}
        for folder in every - watched:
            assert any(folder == top or top in folder.parents for top in beyond), folder
        assert not any(top in other.parents for top in beyond for other in beyond)
        (tmp_path / "later").mkdir()
        wait_for(lambda: str(tmp_path / "later") in watcher.beyond(), "the new folder beyond")
        assert watcher.watched == 4
        gone = next(top for top in beyond if top.parent == tmp_path and top.name != "later")
        (gone / "inner").rmdir()
        gone.rmdir()
        wait_for(lambda: str(gone) not in watcher.beyond(), "the removed folder forgotten")
    finally:
        watcher.stop()


def test_folders_beyond_the_watch_bound_are_polled_and_the_bound_said_once(
    tmp_path: Path,
) -> None:
    """An inbox of 30 folders watched with a bound of 1 (the inbox folder alone): a document put in
    any folder is found by the scan every ``poll_seconds``, long before the reconciliation scan (60
    s); the bound is said in one line, however many looks; a document in the inbox folder itself
    still comes by its event."""
    root = tmp_path / "in"
    folders = [root / f"f{number:02}" for number in range(30)]
    for folder in folders:
        folder.mkdir(parents=True)
    before = inotify_watches()

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            config = inbox(root, max_watches=1, poll_seconds=0.1)
            async with watching(config) as (_, got):
                assert inotify_watches() - before == 1
                (folders[17] / "deep.pdf").write_bytes(PDF)
                await until(lambda: "deep.pdf" in got.names(), "deep.pdf, polled")
                (folders[3] / "later.pdf").write_bytes(PDF)
                (root / "top.pdf").write_bytes(PDF)
                await until(lambda: {"later.pdf", "top.pdf"} <= got.names(), "the others")
        said = [entry for entry in logs if entry["event"] == "inbox_watches_bounded"]
        assert len(said) == 1 and said[0]["polled"] == 30 and said[0]["max_watches"] == 1

    run(scenario())
