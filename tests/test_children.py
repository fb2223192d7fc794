"""``children.run`` behaves as ``subprocess.run`` and ``kill_all`` ends what it waits for, from
another thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from ocrwatch.infra import children


def test_run_returns_what_subprocess_run_returns() -> None:
    done = children.run(
        ["sh", "-c", "echo out; echo err >&2; exit 3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=10,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    assert done.args == ["sh", "-c", "echo out; echo err >&2; exit 3"]
    assert not children._running


def test_a_timeout_kills_the_child_and_raises() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        children.run(["sleep", "30"], stdout=subprocess.DEVNULL, timeout=0.3)
    assert time.monotonic() - started < 5
    assert not children._running


def test_kill_all_ends_a_child_a_thread_waits_for() -> None:
    result: list[subprocess.CompletedProcess[bytes]] = []
    waiter = threading.Thread(
        target=lambda: result.append(children.run(["sleep", "30"], timeout=60))
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while not children._running and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    assert children.kill_all() == 1
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - started < 5
    assert result[0].returncode == -9
    assert children.kill_all() == 0


def test_a_limited_child_cannot_map_more_than_its_limit() -> None:
    """prlimit sets the child's address space before it becomes the program: 512 MiB at once fails
    under 256 MiB, in the child, and succeeds without the limit."""
    grab = [sys.executable, "-c", "bytearray(512 * 2**20)"]
    limited = children.run(grab, memory=256 * 2**20, stderr=subprocess.PIPE, timeout=30)
    assert limited.returncode == 1 and b"MemoryError" in limited.stderr
    assert children.run(grab, timeout=30).returncode == 0
    assert not children._running


def test_a_limited_program_not_on_path_is_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        children.run(["no-such-program-ocrwatch"], memory=2**30, timeout=10)
