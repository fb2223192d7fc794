"""One trust rule for every root (``ocrwatch.config.roots``), with the daemon and the CLI as real
processes and real second users (``useradd``, ``setpriv``): a folder or file ocrwatch starts from is
never a link, is root's or the daemon's user's, is written by no one else unless it is an inbox,
cannot be swapped through a folder on the way, is made at start where missing, and is never a folder
an inbox reads; the configuration is read only when it may be trusted, and its secrets can live in
files. Each refusal at start is exit 2 with one line naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.integration.conftest import REPO, DaemonProcess, sidecars_done, wait_until
from tests.support import docs
from tests.support.users import User

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.integration


def ocrwatch(
    *args: str, config: Path | None, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One ``ocrwatch`` command as a process, as root, in ``cwd``; with no ``config``, none named
    (neither ``--config`` nor ``$OCRWATCH_CONFIG``)."""
    named = ["--config", str(config)] if config is not None else []
    environ = {key: value for key, value in os.environ.items() if key != "OCRWATCH_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "ocrwatch", *args, *named],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def refused(daemon: DaemonProcess, *names: str, env: dict[str, str] | None = None) -> str:
    """``ocrwatch run`` stops at once: exit 2, no traceback, and every one of ``names`` said; what
    it said. A refusal after the configuration was read is one ``startup_failed`` log line."""
    proc = ocrwatch("run", config=daemon.config_path, cwd=daemon.root, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output and all(name in output for name in names), output
    if proc.stderr.startswith("{"):
        events = [json.loads(line) for line in proc.stderr.splitlines()]
        errors = [event for event in events if event["level"] in ("error", "critical")]
        assert [error["event"] for error in errors] == ["startup_failed"], output
        assert errors[0]["hint"] and str(daemon.config_path) in errors[0]["error"], errors
    return output


def configure(daemon: DaemonProcess, **changes: Any) -> None:
    settings = tomllib.loads(daemon.config_path.read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    daemon.config_path.write_text(tomli_w.dumps(settings))


def shared(root: Path, name: str, mode: int) -> Path:
    """A root-owned folder of ``mode`` in the shared root, which every user can reach."""
    folder = root / name
    folder.mkdir()
    folder.chmod(mode)
    return folder


def mine(user: User, path: Path, link_to: Path | None = None) -> None:
    """``user`` makes ``path``: a private folder of theirs, or a link to ``link_to``."""
    command = (
        ["ln", "-s", str(link_to), str(path)] if link_to else ["mkdir", "-m", "700", str(path)]
    )
    done = user.run(command)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def daemon(plugin_daemon: Any, shared_root: Path) -> DaemonProcess:
    """A daemon (the echo engine) on the shared, sticky inbox, not started."""
    inbox = {"path": str(shared_root / "inbox"), "settle_seconds": 0.2, "polling": False}
    made: DaemonProcess = plugin_daemon(inboxes=[inbox])
    made.config_path.chmod(0o640)
    return made


# --- folders another user made first, or made links -----------------------------------------------


@pytest.mark.parametrize("made", ["folder", "link"])
@pytest.mark.parametrize("key", ["inbox[0].quarantine_dir", "[output] dir", "[output] archive_dir"])
def test_a_root_another_user_made_first_is_never_used(
    daemon: DaemonProcess, users: tuple[User, User], shared_root: Path, key: str, made: str
) -> None:
    """Bob makes the quarantine (inside the sticky inbox), the output folder or the archive (in a
    sticky folder anyone may write) before ocrwatch does, as his own folder or as a link to it:
    the start is refused naming the key, and nothing lands in his folder."""
    _, bob = users
    drop, inbox = shared(shared_root, "drop", 0o1777), shared_root / "inbox"
    place = {
        "inbox[0].quarantine_dir": inbox / "quarantine",
        "[output] dir": drop / "out",
        "[output] archive_dir": drop / "archive",
    }[key]
    bobs = drop / "bobs"
    mine(bob, bobs)
    mine(bob, place, link_to=bobs if made == "link" else None)
    if key == "inbox[0].quarantine_dir":
        configure(daemon, inbox=[{"path": str(inbox), "quarantine_dir": str(place)}])
    elif key == "[output] dir":
        configure(daemon, output={"dir": str(place)})
    else:
        configure(daemon, output={"archive_dir": str(place), "on_success": "move"})
    said = refused(daemon, key, str(place))
    assert (f"is owned by {bob.name}" if made == "folder" else "is a symbolic link") in said, said
    assert not any(bobs.iterdir()) and not any(place.iterdir())
    assert not (daemon.state / "ledger.sqlite3").exists(), "the start went on"


def test_a_root_below_a_world_writable_folder_that_is_not_sticky_fails_check_and_run(
    daemon: DaemonProcess, users: tuple[User, User], shared_root: Path
) -> None:
    """The archive is not made yet and its folder is 0777: anyone could make it a link there first
    (or rename it later). ``check`` says so, ``run`` refuses; once Bob has made it a link, both say
    that too."""
    _, bob = users
    public = shared(shared_root, "public", 0o777)
    archive = public / "archive"
    configure(daemon, output={"archive_dir": str(archive), "on_success": "move"})
    proc = ocrwatch("check", config=daemon.config_path, cwd=daemon.root)
    [line] = [line for line in proc.stdout.splitlines() if "archive_dir" in line]
    assert line.startswith(
        f"FAIL [output] archive_dir {archive}: lies in {public}, which others may write and which"
        " is not sticky"
    ), proc.stdout
    assert proc.returncode == 1
    refused(daemon, "[output] archive_dir", "not sticky", f"chmod +t {public}")
    mine(bob, public / "bobs")
    mine(bob, archive, link_to=public / "bobs")
    proc = ocrwatch("check", config=daemon.config_path, cwd=daemon.root)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL [output]")]
    assert len(failed) == 2 and "symbolic link" in failed[1], proc.stdout


def test_a_root_not_made_yet_is_made_at_start_by_the_daemon_and_its_own(
    daemon: DaemonProcess, shared_root: Path
) -> None:
    """Below a sticky folder the archive and the output folder are made at start, root's and
    0755, before any document could need them: no one can take their names first once it runs."""
    drop = shared(shared_root, "drop", 0o1777)
    configure(
        daemon,
        output={"archive_dir": str(drop / "archive" / "2024"), "dir": str(drop / "out")},
    )
    daemon.start()
    try:
        for made in (drop / "archive", drop / "archive" / "2024", drop / "out"):
            info = made.lstat()
            assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0, made
            assert stat.S_IMODE(info.st_mode) & 0o022 == 0, made
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize("case", ["owned by bob", "below a 0777 folder", "a link"])
def test_an_inbox_that_another_user_could_swap_is_refused(
    daemon: DaemonProcess, users: tuple[User, User], shared_root: Path, case: str
) -> None:
    """An inbox may be written by everyone (that is what it is for), but not owned by one of them,
    nor reached through a folder someone could swap, nor a link."""
    _, bob = users
    if case == "owned by bob":
        inbox = shared(shared_root, "drop", 0o1777) / "bobs"
        mine(bob, inbox)
        said = f"is owned by {bob.name}"
    elif case == "below a 0777 folder":
        inbox = shared(shared_root, "public", 0o777) / "inbox"
        inbox.mkdir(mode=0o1777)
        said = "not sticky"
    else:
        inbox = shared_root / "link"
        inbox.symlink_to(shared_root / "inbox")
        said = "is a symbolic link"
    configure(daemon, inbox=[{"path": str(inbox)}])
    refused(daemon, "inbox[0].path", str(inbox), said)


def test_every_root_problem_is_said_at_once(
    daemon: DaemonProcess, users: tuple[User, User], shared_root: Path
) -> None:
    _, bob = users
    drop = shared(shared_root, "drop", 0o1777)
    mine(bob, drop / "out")
    public = shared(shared_root, "public", 0o777)
    configure(daemon, output={"dir": str(drop / "out"), "archive_dir": str(public / "archive")})
    said = refused(daemon, "[output] dir", "[output] archive_dir")
    error = json.loads(next(line for line in said.splitlines() if "startup_failed" in line))
    assert len(error["error"].splitlines()) == 2, error


# --- the configuration ----------------------------------------------------------------------------


def test_another_users_configuration_in_the_working_folder_never_runs_as_root(
    users: tuple[User, User], shared_root: Path
) -> None:
    """Bob leaves an ``ocrwatch.toml`` in the shared inbox whose Tesseract is his program; root runs
    ``ocrwatch check`` and ``ocrwatch ocr`` there. The file is passed over with one line, and his
    program never runs."""
    _, bob = users
    inbox, pwned = shared_root / "inbox", shared_root / "pwned"
    program = inbox / "tesseract"
    script = f'#!/bin/sh\ntouch "{pwned}"\nexec tesseract "$@"\n'
    settings = f'[engine]\nkind = "tesseract"\n[engine.tesseract]\nbinary = "{program}"\n'
    written = bob.run(
        [
            "sh",
            "-c",
            'printf "%s" "$1" > "$2" && chmod 755 "$2" && printf "%s" "$3" > "$4"',
            "sh",
            script,
            str(program),
            settings,
            str(inbox / "ocrwatch.toml"),
        ]
    )
    assert written.returncode == 0, written.stderr
    proc = ocrwatch("check", config=None, cwd=inbox)
    passed = [line for line in proc.stderr.splitlines() if "passed over" in line]
    assert len(passed) == 1 and str(inbox / "ocrwatch.toml") in passed[0], proc.stderr
    assert f"is owned by {bob.name}" in passed[0], passed
    assert "ok   config built-in defaults is valid" in proc.stdout, proc.stdout
    scan = docs.write_png(inbox / "scan.png", ["A SCAN"])
    proc = ocrwatch("ocr", str(scan), config=None, cwd=inbox)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not pwned.exists(), "bob's program ran as root"


@pytest.mark.parametrize("mode", [0o666, 0o664])
def test_a_configuration_others_may_write_is_refused_by_every_command(
    daemon: DaemonProcess, users: tuple[User, User], mode: int
) -> None:
    """0666, or 0664 in a group of Bob's: he could add a hook that runs as root. Refused before
    anything is read from it, naming the file and the fix."""
    _, bob = users
    path = daemon.config_path
    os.chown(path, 0, bob.gid if mode == 0o664 else 0)
    path.chmod(mode)
    who = f"the group {bob.name}" if mode == 0o664 else "others"
    said = refused(daemon, str(path), f"is writable by {who} (mode {mode:04o})")
    assert f"chmod 0640 {path}" in said, said
    for command in ("check", "status"):
        proc = ocrwatch(command, config=path, cwd=daemon.root)
        assert proc.returncode == 2 and f"chmod 0640 {path}" in proc.stderr, proc.stderr


def test_a_reload_that_breaks_the_rule_is_refused_and_the_old_configuration_kept(
    daemon: DaemonProcess, users: tuple[User, User], shared_root: Path
) -> None:
    """SIGHUP with an inbox Bob made added, then with the file made 0666: each reload is refused
    with one line naming what and how to fix it; the inboxes stay as they were until a reload that
    passes."""
    _, bob = users
    drop = shared(shared_root, "drop", 0o1777)
    mine(bob, drop / "bobs")
    inbox = {"path": str(shared_root / "inbox"), "settle_seconds": 0.2, "polling": False}
    daemon.start()
    try:

        def reload(expected: str) -> dict[str, Any]:
            before = len(daemon.events())
            daemon.signal(signal.SIGHUP)
            wait_until(
                lambda: any(
                    e.get("event") in ("reload_failed", "config_reloaded")
                    for e in daemon.events()[before:]
                ),
                20,
                "the reload's answer",
            )
            [answer] = [
                e
                for e in daemon.events()[before:]
                if e.get("event") in ("reload_failed", "config_reloaded")
            ]
            assert answer["event"] == expected, answer
            return answer

        configure(daemon, inbox=[inbox, {"path": str(drop / "bobs")}])
        failed = reload("reload_failed")
        assert "inbox[1].path" in failed["error"] and f"owned by {bob.name}" in failed["error"]
        assert failed["hint"], failed
        configure(daemon, inbox=[inbox, {"path": str(drop / "ours")}])
        daemon.config_path.chmod(0o666)
        failed = reload("reload_failed")
        assert f"chmod 0640 {daemon.config_path}" in failed["error"], failed
        assert not (drop / "ours").exists(), "a refused reload made its inbox"
        daemon.config_path.chmod(0o640)
        reloaded = reload("config_reloaded")
        assert reloaded["inboxes"] == [inbox["path"], str(drop / "ours")], reloaded
    finally:
        assert daemon.stop() == 0


# --- secrets --------------------------------------------------------------------------------------


class Receiver(BaseHTTPRequestHandler):
    """Records each POST's headers; answers 200."""

    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Seen", (Receiver,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/done", seen
    finally:
        server.shutdown()
        server.server_close()


def test_secrets_others_may_read_are_said_by_run_and_check(
    daemon: DaemonProcess, receiver: tuple[str, list[dict[str, str]]]
) -> None:
    url, _ = receiver
    configure(daemon, hook=[{"url": url, "token": "inline-secret"}])
    path = daemon.config_path
    path.chmod(0o644)
    proc = ocrwatch("check", config=path, cwd=daemon.root)
    expected = f"FAIL config {path}: holds secrets (hook[0].token) that others may read (mode 0644)"
    assert expected in proc.stdout, proc.stdout
    daemon.start()
    assert daemon.stop() == 0
    [warned] = [e for e in daemon.events() if e.get("event") == "secrets_readable"]
    assert (warned["key"], warned["path"]) == ("config", str(path)), warned
    assert "inline-secret" not in daemon.log_text()
    path.chmod(0o640)
    proc = ocrwatch("check", config=path, cwd=daemon.root)
    assert "holds secrets" not in proc.stdout, proc.stdout


def test_a_secret_is_read_from_its_file_which_the_rule_holds_too(
    daemon: DaemonProcess, receiver: tuple[str, list[dict[str, str]]], shared_root: Path
) -> None:
    """``token_file`` (as systemd's ``LoadCredential=`` would hand it over): the hook is sent the
    file's token and the configuration holds none; the same file writable by others stops the
    start, naming the key."""
    url, seen = receiver
    token = daemon.root / "hook-token"
    token.write_text("token-from-a-file\n")
    token.chmod(0o600)
    configure(daemon, hook=[{"url": url, "token_file": str(token), "on": ["ok"]}])
    daemon.config_path.chmod(0o644)  # no secret in it: nothing to warn of
    daemon.start()
    try:
        source = docs.write_png(shared_root / "inbox" / "scan.png", ["A SCAN"])
        wait_until(lambda: sidecars_done(source) and seen, 60, "the hook's POST")
    finally:
        assert daemon.stop() == 0
    assert seen[0]["Authorization"] == "Bearer token-from-a-file"
    assert not [e for e in daemon.events() if e.get("event") == "secrets_readable"]
    token.chmod(0o666)
    refused(daemon, "hook[0].token_file", str(token), "is writable by others")


# --- folders an inbox would read; empty paths -----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "inside"), [("state_dir", "state"), ("[output] dir", "out"), ("[output] dir", "a/out")]
)
def test_a_folder_ocrwatch_writes_inside_a_recursive_inbox_is_refused(
    daemon: DaemonProcess, shared_root: Path, key: str, inside: str
) -> None:
    """Each spool copy in a state_dir, each output in an output folder the inbox reads would come
    back as a new document: refused, naming both keys and how to leave it out."""
    inbox = shared_root / "inbox"
    if key == "state_dir":
        configure(daemon, state_dir=str(inbox / inside))
    else:
        configure(daemon, output={"dir": str(inbox / inside)})
    said = refused(daemon, key, "lies inside inbox[0].path", "which would read it")
    assert f'ignore = [\\"{inside.split("/")[0]}/\\"]' in said, said


@pytest.mark.parametrize("variable", ["OCRWATCH_STATE_DIR", "OCRWATCH_INBOX_0_PATH"])
def test_an_empty_path_from_the_environment_is_refused(
    daemon: DaemonProcess, variable: str
) -> None:
    said = refused(daemon, f"environment: {variable}: an empty path", env={variable: ""})
    assert 'write "." for the working folder' in said, said


def test_a_hidden_state_dir_inside_the_inbox_is_left_out_by_the_inbox_rule(
    daemon: DaemonProcess, shared_root: Path
) -> None:
    """The inbox's own rule (hidden names are never taken) keeps it out: accepted, and one
    document is one job, its spool copy never taken for another."""
    inbox = shared_root / "inbox"
    configure(daemon, state_dir=str(inbox / ".ocrwatch"))
    daemon.state = inbox / ".ocrwatch"
    daemon.start()
    try:
        source = docs.write_png(inbox / "scan.png", ["A SCAN"])
        wait_until(lambda: sidecars_done(source), 60, "the sidecars")
    finally:
        assert daemon.stop() == 0
    started = [e["uri"] for e in daemon.events() if e.get("event") == "job_started"]
    assert started == [source.as_uri()], started
