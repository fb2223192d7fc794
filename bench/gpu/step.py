"""One benchmark step that cannot outlive its deadline or hold the caller's output.

    python3 bench/gpu/step.py --until EPOCH_S --log FILE [--show REGEX] [--grace S] -- CMD [ARG...]

CMD runs in a process group and session of its own with stdin from /dev/null and stdout and stderr
in FILE, never a pipe: a pipe is held open by every process that inherits it, and vLLM's engine-core
child outlives a killed parent, so a ``cmd | tee | grep`` waited for it long after the step ended.
This process is the *subreaper* of everything CMD starts (``PR_SET_CHILD_SUBREAPER``): a grandchild
that leads a session of its own (e2e.py's daemon) or is orphaned (the engine core) is re-parented
here, not to init, so it is still found.

At ``--until`` (seconds since the epoch) CMD's group gets SIGINT, so a Python step writes what it
measured; ``--grace`` seconds later every process left below this one gets SIGKILL. When CMD ends on
its own, whatever it left running is stopped the same way (SIGTERM, then SIGKILL). Lines of FILE
matching ``--show`` are printed as they come (cut to 300 characters). Exits with CMD's status; 124
when the deadline cut it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
CUT = 124


def become_subreaper() -> bool:
    """Orphans below this process are re-parented to it (Linux 3.4+); False where the call is
    refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, read from /proc (children first-found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def reap() -> None:
    """Collect every exited child (re-parented orphans included), so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(grace: float, first: int = signal.SIGTERM) -> None:
    """``first`` to every process below this one, then SIGKILL to what is left after ``grace``
    seconds."""
    signal_all(descendants(os.getpid()), first)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        reap()
        if not descendants(os.getpid()):
            return
        time.sleep(0.2)
    signal_all(descendants(os.getpid()), signal.SIGKILL)
    for _ in range(50):
        reap()
        if not descendants(os.getpid()):
            return
        time.sleep(0.1)


class Follower:
    """Prints the lines of the step's log that match a pattern, as the log grows."""

    def __init__(self, path: Path, pattern: str | None) -> None:
        self.path, self.pattern, self.offset, self.rest = (
            path,
            re.compile(pattern) if pattern else None,
            0,
            b"",
        )

    def poll(self, final: bool = False) -> None:
        if self.pattern is None:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = b"" if final else lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            if self.pattern.search(line):
                print(line[:300], flush=True)


def run(cmd: list[str], until: float, log: Path, show: str | None, grace: float) -> int:
    become_subreaper()
    log.parent.mkdir(parents=True, exist_ok=True)
    follower = Follower(log, show)
    with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
        try:
            proc = subprocess.Popen(
                cmd, stdin=devnull, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            out.write(f"step.py: could not start {cmd[0]}: {exc}\n".encode())
            return 127
    cut = False
    while proc.poll() is None:
        follower.poll()
        if time.time() >= until and not cut:
            cut = True
            with open(log, "ab") as out:
                out.write(f"\nstep.py: deadline reached, SIGINT to {cmd[0]}'s group\n".encode())
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            end = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < end:
                time.sleep(0.2)
            if proc.poll() is None:
                signal_all(descendants(os.getpid()), signal.SIGKILL)
                proc.wait()
            break
        time.sleep(0.5)
    stop_tree(grace if not cut else 0.0)
    follower.poll(final=True)
    return CUT if cut else proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--until", type=float, required=True, help="deadline, seconds since the epoch")
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument(
        "--show", default=None, help="print the log's lines that match this regular expression"
    )
    ap.add_argument(
        "--grace", type=float, default=10.0, help="seconds from SIGINT (or the end) to SIGKILL"
    )
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    return run(cmd, a.until, a.log, a.show, a.grace)


if __name__ == "__main__":
    sys.exit(main())
