"""Real second users of a shared inbox: made with ``useradd``, run through ``setpriv``.

A shared-inbox promise is about what one ordinary user can do to another through a root daemon, so the
tests that check one act as those users for real: the kernel's permission checks decide, not a double.
The users are made once per test process (named after its pid, so parallel workers never share one) and
removed at its end; the shared folder lies outside pytest's 0700 temporary root so they can reach it.
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

import pytest


@dataclass(frozen=True)
class User:
    """An ordinary local user, and how to run a command as them (no capability, no root)."""

    name: str
    uid: int
    gid: int

    def argv(self, command: Sequence[str]) -> list[str]:
        return [
            "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--", *command,
        ]  # fmt: skip

    def run(self, command: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as this user; the caller checks the outcome."""
        return subprocess.run(self.argv(command), capture_output=True, text=True, check=False, **kwargs)

    def popen(self, command: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(command), text=True, **kwargs)

    def python(self, code: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` as this user, with ``args`` as its ``sys.argv[1:]``."""
        return self.run([sys_python(), "-c", code, *args], **kwargs)


def sys_python() -> str:
    """An interpreter every user may run: the system's, since pyenv's lives under root's 0700 home."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


def _make(name: str) -> User:
    subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
    done = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot add the user {name}: {done.stderr.strip()}")
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[User, User]]:
    """Alice and Bob, two ordinary users; skips unless root with ``useradd`` and ``setpriv``."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root with useradd and setpriv to act as two real users")
    tag = os.getpid() % 100000
    made = [_make(f"ow{tag}a"), _make(f"ow{tag}b")]
    yield made[0], made[1]
    for user in made:
        subprocess.run(["userdel", user.name], capture_output=True, check=False)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder every user can reach, holding a sticky, world-writable ``inbox`` (mode 1777), as a shared
    inbox is; removed after the test."""
    root = Path(tempfile.mkdtemp(prefix="ocrwatch-shared-"))
    root.chmod(0o755)
    (root / "inbox").mkdir()
    (root / "inbox").chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)
