"""Start-up on a broken state, through the real CLI: ``run``, ``status`` and ``retry`` as processes.

A ledger that is garbage, cut short, damaged in the middle or from a newer ocrwatch, a state_dir the
daemon cannot write, a state_dir another daemon holds: each is something only the user can fix, so
each ends in one line that names the file and says what to do, exit 2 (which the systemd unit does
not restart on) and no traceback; the broken ledger is left exactly as it was.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, PluginDaemon
from tests.support import ledgers

pytestmark = pytest.mark.integration

COMMANDS = ("run", "status", "retry")
# Root writes anywhere; without these capabilities it meets a folder's mode as any user would.
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
)


@pytest.fixture
def daemon(tmp_path: Path) -> PluginDaemon:
    """The daemon's configuration and folders only: each test runs the CLI itself."""
    return PluginDaemon(tmp_path, "tests.support.fault_engines:EchoEngine")


def ocrwatch(
    daemon: PluginDaemon, command: str, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [
            *(prefix or []),
            sys.executable,
            "-m",
            "ocrwatch",
            command,
            "--config",
            str(daemon.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=daemon.root,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess[str], command: str, names: Path) -> str:
    """Exit 2, no traceback, and exactly one error line, which names ``names``; returns that
    line."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    # the daemon logs JSON lines (as under systemd): all of them parse, one is the error
    if command == "run":
        lines = proc.stderr.splitlines()
        events = [json.loads(line) for line in lines]
        errors = [
            line
            for line, event in zip(lines, events, strict=True)
            if event["level"] in ("error", "critical")
        ]
        assert [e["event"] for e in events if e["level"] in ("error", "critical")] == [
            "startup_failed"
        ], output
        assert not proc.stdout
    else:
        errors = proc.stderr.splitlines()
        assert not proc.stdout, output
    assert len(errors) == 1, output
    assert str(names) in errors[0] and "hint" in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("breaker", list(ledgers.BREAKERS))
def test_a_broken_ledger_is_one_line_and_exit_2(
    daemon: PluginDaemon, breaker: str, command: str
) -> None:
    ledger = daemon.state / "ledger.sqlite3"
    ledgers.make_ledger(ledger, daemon.inbox)
    ledgers.BREAKERS[breaker](ledger)
    before = ledger.read_bytes()
    line = assert_one_error_line(ocrwatch(daemon, command), command, ledger)
    assert ("newer than this ocrwatch" if breaker == "newer schema" else "is damaged") in line
    assert ledger.read_bytes() == before, "the broken ledger was changed"


@pytest.fixture
def read_only_state(daemon: PluginDaemon) -> Iterator[Path]:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a folder's mode cannot stop this process")
    ledgers.make_ledger(daemon.state / "ledger.sqlite3", daemon.inbox, rows=10)
    daemon.state.chmod(0o500)
    yield daemon.state
    daemon.state.chmod(0o700)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_state_dir_is_one_line_and_exit_2(
    daemon: PluginDaemon, read_only_state: Path, command: str
) -> None:
    assert_one_error_line(ocrwatch(daemon, command, AS_A_USER), command, read_only_state)
    assert sorted(p.name for p in read_only_state.iterdir()) == ["ledger.sqlite3"]


def test_a_state_dir_held_by_another_daemon(daemon: PluginDaemon) -> None:
    """``run`` refuses (two daemons would process every document twice); ``status`` and ``retry``
    are meant to be used beside a running daemon, and work."""
    ledgers.make_ledger(daemon.state / "ledger.sqlite3", daemon.inbox, rows=10)
    with open(daemon.state / "daemon.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the other daemon holds it
        line = assert_one_error_line(ocrwatch(daemon, "run"), "run", daemon.state)
        assert "in use by another running ocrwatch" in line
        status = ocrwatch(daemon, "status")
        assert status.returncode == 0 and "done         10" in status.stdout, (
            status.stdout + status.stderr
        )
        retry = ocrwatch(daemon, "retry")
        assert retry.returncode == 0 and retry.stdout.startswith("0 job(s)"), (
            retry.stdout + retry.stderr
        )


def test_status_and_retry_on_a_state_dir_never_used_create_nothing(daemon: PluginDaemon) -> None:
    for command in ("status", "retry"):
        proc = ocrwatch(daemon, command)
        assert proc.returncode == 2 and "no ledger at" in proc.stderr, proc.stdout + proc.stderr
    assert not daemon.state.exists()


# --- a state_dir others may write, or another user's ---------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=lambda mode: f"{mode:04o}")
def test_a_state_dir_others_may_write_is_refused_in_one_line(
    daemon: PluginDaemon, mode: int, command: str
) -> None:
    """Anyone who may write in state_dir may replace the ledger (and read every path in it): nothing
    starts, and nothing is made or changed there."""
    ledgers.make_ledger(daemon.state / "ledger.sqlite3", daemon.inbox, rows=10)
    daemon.state.chmod(mode)

    def listing() -> list[tuple[str, int, int]]:
        return sorted((p.name, p.stat().st_mode, p.stat().st_size) for p in daemon.state.iterdir())

    before = listing()
    line = assert_one_error_line(ocrwatch(daemon, command), command, daemon.state)
    assert "writable by" in line and f"chmod 700 {daemon.state}" in line, line
    assert listing() == before


def test_a_state_dir_of_another_user_is_refused_in_one_line(
    daemon: PluginDaemon, users: Any
) -> None:
    _, bob = users
    daemon.state.mkdir(mode=0o700)
    os.chown(daemon.state, bob.uid, bob.gid)
    line = assert_one_error_line(ocrwatch(daemon, "run"), "run", daemon.state)
    assert f"is owned by {bob.name}" in line, line
    assert list(daemon.state.iterdir()) == []


def test_every_file_in_state_dir_is_private_and_an_older_ledger_is_made_so(
    daemon: PluginDaemon,
) -> None:
    """A ledger, its -wal and -shm and the lock as a version before this one left them (0644) are
    0600 once the daemon runs; what it makes itself is 0600 (files) or 0700 (folders)."""
    ledger = daemon.state / "ledger.sqlite3"
    ledgers.make_ledger(ledger, daemon.inbox, rows=10)
    (daemon.state / "daemon.lock").touch()
    with closing(sqlite3.connect(ledger)) as reader:
        reader.execute("SELECT count(*) FROM jobs").fetchone()  # -wal and -shm exist while it reads
        for path in daemon.state.iterdir():
            path.chmod(0o644)
        daemon.start()
        found = {path.name: stat.S_IMODE(path.stat().st_mode) for path in daemon.state.iterdir()}
    assert daemon.stop() == 0
    assert stat.S_IMODE(daemon.state.stat().st_mode) == 0o700
    made = {"ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm", "daemon.lock", "tmp"}
    assert made | {"control.sock"} <= set(found), found
    assert {name: mode for name, mode in found.items() if mode & 0o077} == {}, found
