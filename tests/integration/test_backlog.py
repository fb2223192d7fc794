"""A backlog dropped at once through ``ocrwatch run``: the files wait in the ledger, and SIGTERM
stops the daemon within ``shutdown_timeout`` + 5 s with one line for the jobs left waiting, not one
line per job.

The engine never answers (``HangingEngine``), so the first ``max_active_documents`` documents hold
every slot until the stop cancels them. The memory side (RSS per queued file) is
``bench/backlog.py``'s to measure.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from tests.integration.conftest import PluginDaemon, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

FILES = 2000
FOLDERS = 10
SHUTDOWN_TIMEOUT = 2.0


def unfinished(ledger: Path) -> list[tuple[str, int]]:
    if not ledger.exists():
        return []
    with closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5)) as conn:
        return conn.execute(
            "SELECT state, attempts FROM jobs WHERE state NOT IN ('done', 'failed')"
        ).fetchall()


def test_a_backlog_waits_in_the_ledger_and_a_stop_leaves_it_there_in_one_line(
    plugin_daemon: Callable[..., PluginDaemon], tmp_path: Path
) -> None:
    daemon = plugin_daemon(
        "tests.support.fault_engines:HangingEngine",
        {"match": "."},
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT, "reconcile_seconds": 3600.0},
    )
    page = docs.write_png(tmp_path / "page.png", ["waiting"], dpi=None).read_bytes()
    staged = tmp_path / "staged"
    folders = [staged / f"folder-{n:02d}" for n in range(FOLDERS)]
    for folder in folders:
        folder.mkdir(parents=True)
    for number in range(FILES):
        (folders[number % FOLDERS] / f"page-{number:05d}.png").write_bytes(page)
    daemon.start()
    for folder in folders:
        (daemon.inbox / folder.name).mkdir()
        for path in folder.iterdir():
            path.rename(daemon.inbox / folder.name / path.name)
    ledger = daemon.state / "ledger.sqlite3"
    wait_until(lambda: len(unfinished(ledger)) == FILES, 120, "the files admitted", interval=0.5)

    def started() -> bool:
        return any(e.get("event") == "job_started" for e in daemon.events())

    wait_until(started, 30, "the first job started")

    assert daemon.proc is not None
    stopping = time.monotonic()
    daemon.signal(signal.SIGTERM)
    try:
        code = daemon.proc.wait(SHUTDOWN_TIMEOUT + 5)
    except subprocess.TimeoutExpired:
        daemon.kill()
        raise AssertionError(f"still running {SHUTDOWN_TIMEOUT + 5:g} s after SIGTERM") from None
    assert code == 0 and time.monotonic() - stopping <= SHUTDOWN_TIMEOUT + 5

    events = daemon.events()
    begun = sum(e.get("event") == "job_started" for e in events)
    interrupted = sum(e.get("event") == "job_interrupted" for e in events)
    assert 0 < interrupted == begun <= 2 * 64, (begun, interrupted)  # those in memory, not the rest
    (left,) = [e for e in events if e.get("event") == "jobs_left_queued"]
    assert left["jobs"] == FILES
    assert {attempts for _, attempts in unfinished(ledger)} == {0}  # the interrupted ones' back
    assert len(os.listdir(daemon.state / "tmp")) == 0
