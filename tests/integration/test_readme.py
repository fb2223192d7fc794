"""The README's first command, run as written the way a newcomer meets it: in a fresh copy of the
project, with the system's ``python3`` first on ``PATH`` (whose ``pip`` refuses to install under PEP
668), the daemon on its embedded defaults; a PNG dropped into ``./inbox`` gets its sidecars, and
SIGTERM ends the command with exit 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, children_named, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def readme_commands() -> list[str]:
    """The ``sh`` blocks under "The two commands", in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.DOTALL)


def test_the_readme_names_exactly_two_commands_the_second_being_the_test_command() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert commands[1] == "bash tests/run.sh"
    assert (REPO / ".ci" / "run").read_text().strip().endswith("bash tests/run.sh")


def fresh_copy(target: Path) -> Path:
    """The project's tracked files as a clone would have them, without this checkout's ``.venv``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            (target / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / os.fsdecode(name))
    return target


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3 at /usr/bin")
@pytest.mark.skipif(os.geteuid() != 0, reason="the command installs Debian packages as root")
@pytest.mark.timeout(600)
def test_the_first_command_runs_the_daemon_as_written_with_the_systems_python(
    tmp_path: Path,
) -> None:
    externally = list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))
    assert externally, "this system's python3 is not marked externally managed (PEP 668)"
    project = fresh_copy(tmp_path / "ocrwatch")
    env = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    log = (tmp_path / "command.log").open("wb")
    command = subprocess.Popen(
        ["bash", "-c", readme_commands()[0]],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def daemon() -> int | None:
            if command.poll() is not None:
                raise AssertionError(f"the command ended: {(tmp_path / 'command.log').read_text()}")
            # bash runs the last command of the list in its own process (exec) or in a child
            itself = Path(f"/proc/{command.pid}/comm").read_text().strip() == "ocrwatch"
            found = [command.pid] if itself else children_named(command.pid, "ocrwatch")
            ready = b'"daemon_ready"' in (tmp_path / "command.log").read_bytes()
            return found[0] if found and ready else None

        pid = wait_until(daemon, 420, "the daemon started by the README's command", 0.5)
        (project / "inbox" / ".incoming").mkdir()
        hidden = docs.write_png(
            project / "inbox" / ".incoming" / "hello.png", ["Hello from the README"]
        )
        os.replace(hidden, project / "inbox" / "hello.png")
        sidecar = project / "inbox" / "hello.png.json"
        wait_until(sidecar.exists, 60, "the sidecars")
        assert json.loads(sidecar.read_text())["status"] == "ok"
        assert "Hello" in (project / "inbox" / "hello.png.md").read_text()
        os.kill(pid, signal.SIGTERM)
        assert command.wait(60) == 0
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()
        log.close()
