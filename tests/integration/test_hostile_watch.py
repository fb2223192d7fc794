"""What a user of a shared inbox can do to its watching, through the real daemon process (issue 24,
items 7 and 8; issue 34, item 5): a chain of folders 2,500 deep, present at start and moved in while
running, an event storm with a SIGTERM in the middle of it, and thousands of empty folders."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until
from tests.support import docs
from tests.support.chains import make_chain, removed_after

pytestmark = pytest.mark.integration

ECHO = "tests.support.fault_engines:EchoEngine"
DEEP = 2500
SHUTDOWN_TIMEOUT = 3.0
ROUNDS = 10
STORM_SECONDS = 1.0
# Files made, written, renamed and removed as fast as a process can, until it is killed: every other
# name a document's, so the source follows each, the rest temporaries. On the old code a SIGTERM
# sent in the middle of it was lost in about two rounds of five: ten rounds miss such a loss less
# than once in a hundred runs.
STORM = """
import os, sys
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
i = 0
while True:
    name = os.path.join(folder, f"s{i % 256}." + ("png" if i % 2 else "tmp"))
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 64)
    os.close(fd)
    os.rename(name, name + ".txt")
    os.unlink(name + ".txt")
    i += 1
"""


FOLDERS = 2000
BOUND = 100


def watched_inodes(pid: int) -> set[int]:
    """The inodes of the folders a process holds inotify watches on, as the kernel lists them
    (``ino:`` in hexadecimal, one ``inotify wd:`` line per watch in each inotify descriptor's
    fdinfo)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == "anon_inode:inotify":
                for line in Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().splitlines():
                    if line.startswith("inotify wd:"):
                        inodes.add(int(line.split(" ino:")[1].split()[0], 16))
    return inodes


def refused_folders(daemon: DaemonProcess) -> list[str]:
    return [event["path"] for event in daemon.events() if event.get("event") == "local_refused"]


def test_a_folder_chain_2500_deep_stops_neither_the_inbox_nor_the_daemon(
    plugin_daemon, tmp_path: Path
) -> None:
    """Before: the start with the chain present exited 1 (``RecursionError`` adding the watches), a
    restart loop under ``Restart=on-failure``; a chain moved in while running killed the watcher's
    thread without a word."""
    daemon = plugin_daemon(ECHO, inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 0.2}])
    inbox, outside = daemon.inbox, tmp_path / "outside"
    outside.mkdir()
    with removed_after((inbox, "d"), (inbox, "e"), (outside, "e")):
        make_chain(inbox, DEEP, "d")
        make_chain(outside, DEEP, "e")
        daemon.start()
        first = docs.write_png(inbox / "first.png", ["FIRST"])
        wait_until(
            lambda: sidecars_done(first), 60, f"first.png's sidecars:\n{daemon.log_text()[-3000:]}"
        )

        os.rename(outside / "e", inbox / "e")
        # by an event: the scan is a minute away
        second = docs.write_png(inbox / "second.png", ["SECOND"])
        wait_until(
            lambda: sidecars_done(second),
            30,
            f"second.png's sidecars:\n{daemon.log_text()[-3000:]}",
        )
        too_deep = [str(inbox.resolve().joinpath(*[name] * 33)) for name in ("d", "e")]
        wait_until(
            lambda: sorted(refused_folders(daemon)) == too_deep, 10, "each chain refused once"
        )
        assert 'ocrwatch_inbox_watcher_restarts_total{inbox="' in daemon.metrics()
        assert daemon.stop(timeout=30) == 0
        assert "Traceback" not in daemon.log_text() and "RecursionError" not in daemon.log_text()

        daemon.start()  # a restart with both chains present serves the rest
        third = docs.write_png(inbox / "third.png", ["THIRD"])
        wait_until(
            lambda: sidecars_done(third), 60, f"third.png's sidecars:\n{daemon.log_text()[-3000:]}"
        )
        assert sorted(refused_folders(daemon)) == too_deep
        assert daemon.stop(timeout=30) == 0
        assert "Traceback" not in daemon.log_text()


def test_a_sigterm_in_an_event_storm_stops_the_daemon_every_time(
    plugin_daemon, tmp_path: Path
) -> None:
    """Before: watchdog's events reached the loop a ``call_soon_threadsafe`` each, a byte each in
    the loop's self-pipe; the storm filled it, the byte of the SIGTERM was dropped ("Exception
    ignored when trying to write to the signal wakeup fd") and the daemon ran on. Now the events
    come in batches and the signal is caught by a handler of its own: ``ROUNDS`` storms in a row,
    each SIGTERM ends the daemon with 0 in its bound."""
    bound = SHUTDOWN_TIMEOUT + 5
    for round_ in range(ROUNDS):
        root = tmp_path / f"round-{round_}"
        daemon = plugin_daemon(
            ECHO,
            root=root,
            inboxes=[{"path": str(root / "inbox"), "settle_seconds": 0.3}],
            daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT},
        )
        daemon.start()
        storm = subprocess.Popen([sys.executable, "-c", STORM, str(daemon.inbox / "storm")])
        try:
            time.sleep(STORM_SECONDS)
            assert storm.poll() is None, "the storm ended early"
            daemon.signal(signal.SIGTERM)
            sent = time.monotonic()
        finally:
            storm.kill()
            storm.wait()
        assert daemon.proc is not None
        try:
            code = daemon.proc.wait(bound)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
        log = daemon.log_text()
        assert code == 0, (
            f"round {round_}: exit {code} after {took:.1f}s (bound {bound:g}s):\n{log[-3000:]}"
        )
        assert "daemon_stopped" in log and "wakeup fd" not in log, f"round {round_}:\n{log[-3000:]}"
        daemon.stop()


def test_thousands_of_empty_folders_take_no_more_watches_than_the_bound_and_are_polled(
    plugin_daemon, tmp_path: Path
) -> None:
    """Before: bob's 20,000 empty folders took 20,001 inotify watches from the daemon user's kernel
    budget. Now the inbox takes ``max_watches`` (the kernel's own count of the daemon's watches
    says so), one line says the bound is reached, and a document put in a folder the daemon does
    not watch is found by the scan of the folders beyond the bound, every ``poll_seconds``."""
    daemon = plugin_daemon(
        ECHO,
        inboxes=[
            {
                "path": str(tmp_path / "inbox"),
                "settle_seconds": 0.2,
                "max_watches": BOUND,
                "poll_seconds": 0.5,
            }
        ],
    )
    for number in range(FOLDERS):
        (daemon.inbox / f"bob-{number:05}").mkdir()
    daemon.start()
    assert daemon.proc is not None
    watched = wait_until(
        lambda: (found := watched_inodes(daemon.proc.pid)) and len(found) == BOUND and found,
        30,
        lambda: f"{BOUND} watches, not {len(watched_inodes(daemon.proc.pid))}",
    )
    assert daemon.inbox.stat().st_ino in watched
    unwatched = [path for path in daemon.inbox.iterdir() if path.stat().st_ino not in watched]
    assert len(unwatched) == FOLDERS + 1 - BOUND
    found = docs.write_png(unwatched[len(unwatched) // 2] / "found.png", ["FOUND"])
    wait_until(
        lambda: sidecars_done(found), 30, f"found.png's sidecars:\n{daemon.log_text()[-3000:]}"
    )
    said = [e for e in daemon.events() if e.get("event") == "inbox_watches_bounded"]
    assert len(said) == 1 and said[0]["polled"] == FOLDERS + 1 - BOUND
    assert len(watched_inodes(daemon.proc.pid)) == BOUND
    assert daemon.stop() == 0
