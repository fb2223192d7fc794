"""Real second users of a shared inbox: made with ``useradd``, run through ``setpriv``.

A shared-inbox promise is about what one ordinary user can do to another through a root daemon, so
the tests that check one act as those users for real: the kernel's permission checks decide, not a
double. The users are made once per run, named after the pid of the process that makes them (the
pytest-xdist controller, or the one test process), and removed at its end; the shared folder lies
outside pytest's 0700 temporary root so they can reach it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class User:
    """An ordinary local user, and how to run a command as them (no capability, no root)."""

    name: str
    uid: int
    gid: int

    def argv(self, command: Sequence[str]) -> list[str]:
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            *command,
        ]

    def run(self, command: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as this user; the caller checks the outcome."""
        return subprocess.run(
            self.argv(command), capture_output=True, text=True, check=False, **kwargs
        )

    def popen(self, command: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(command), text=True, **kwargs)

    def python(self, code: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` as this user, with ``args`` as its ``sys.argv[1:]``."""
        return self.run([sys_python(), "-c", code, *args], **kwargs)


def sys_python() -> str:
    """An interpreter every user may run: the system's, since pyenv's lives under root's 0700
    home."""
    return (
        "/usr/bin/python3"
        if os.access("/usr/bin/python3", os.X_OK)
        else os.path.realpath(sys.executable)
    )


def _make(name: str) -> User | str:
    """The user ``name``, made afresh; or why it cannot be made."""
    subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
    done = subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"cannot add the user {name}: {done.stderr.strip()}"
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


def _make_pair() -> tuple[User, User] | str:
    """Alice and Bob, named after this process; or why they cannot be made."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        return "needs root with useradd and setpriv to act as two real users"
    tag = os.getpid() % 100000
    alice = _make(f"ow{tag}a")
    if isinstance(alice, str):
        return alice
    bob = _make(f"ow{tag}b")
    if isinstance(bob, str):
        _remove([alice])
        return bob
    return alice, bob


def _remove(made: Sequence[User]) -> None:
    """Remove the users; one still running a process stays (``userdel`` refuses), as before."""
    for user in made:
        subprocess.run(["userdel", user.name], capture_output=True, check=False)


_PAIR = pytest.StashKey[tuple[User, User] | str]()
_WORKER_INPUT = "ocrwatch_users"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist the controller makes the two users before any worker starts, and every
    worker acts as them: the account files then stay as they are while tests run (a test checks
    that ``/etc/passwd`` is left unchanged), and no worker adds users while another reads them."""
    if session.config.pluginmanager.hasplugin("dsession"):
        session.config.stash[_PAIR] = _make_pair()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Hand the controller's users (or why there are none) to a starting xdist worker."""
    pair = node.config.stash.get(_PAIR, None)
    if pair is not None:
        given = pair if isinstance(pair, str) else [vars(user) for user in pair]
        node.workerinput[_WORKER_INPUT] = given


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller removes the users it made, once every worker is done with them."""
    pair = session.config.stash.get(_PAIR, None)
    if pair is not None and not isinstance(pair, str):
        _remove(pair)


@pytest.fixture(scope="session")
def users(request: pytest.FixtureRequest) -> Iterator[tuple[User, User]]:
    """Alice and Bob, two ordinary users; skips unless root with ``useradd`` and ``setpriv``. Under
    xdist, the controller's; otherwise made for this process and removed at its end."""
    given = getattr(request.config, "workerinput", {}).get(_WORKER_INPUT)
    if given is not None:
        if isinstance(given, str):
            pytest.skip(given)
        yield User(**given[0]), User(**given[1])
        return
    pair = _make_pair()
    if isinstance(pair, str):
        pytest.skip(pair)
    yield pair
    _remove(pair)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder every user can reach, holding a sticky, world-writable ``inbox`` (mode 1777), as a
    shared inbox is; removed after the test."""
    root = Path(tempfile.mkdtemp(prefix="ocrwatch-shared-"))
    root.chmod(0o755)
    (root / "inbox").mkdir()
    (root / "inbox").chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)
