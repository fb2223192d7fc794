"""The CLI as a client of the running daemon (``ocrwatch.control``): real daemon processes, real CLI
processes.

``retry`` starts the jobs at once, ``ocr`` hands its files to the daemon's engine (none is built in
the CLI) and shows their pages, ``status`` shows the running documents' pages and the queue by
inbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration


def cli(
    daemon: DaemonProcess, *args: str | Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrwatch", *map(str, args), "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=daemon.root,
    )


def events_named(daemon: DaemonProcess, name: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in daemon.events()
        if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
    ]


def test_retry_starts_a_fixed_document_within_seconds(make_daemon) -> None:
    """A document failed for a reason outside it (a user's file at its sidecar's name); once that is
    moved away, ``ocrwatch retry`` has the running daemon do it at once, not at its next scan or
    restart."""
    daemon = make_daemon(daemon={"reconcile_seconds": 600.0}).start()
    theirs = daemon.inbox / "scan.png.json"
    theirs.write_text('{"mine": true}\n')
    source = docs.write_png(daemon.inbox / "scan.png", ["Retried at once"])
    error = wait_until(lambda: error_sidecar(source), 60, "the output_conflict failure")
    assert error["error"]["kind"] == "output_conflict"
    nothing = cli(daemon, "retry", daemon.inbox / "nothing.png")  # the daemon matched none
    assert nothing.returncode == 2 and "queued again" not in nothing.stdout, nothing.stdout
    assert f"no failed job matches {daemon.inbox / 'nothing.png'} " in nothing.stderr
    theirs.unlink()
    proc = cli(daemon, "retry", source)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"1 job(s) queued again; the running daemon (pid {daemon.proc.pid}) started them"
        in proc.stdout
    )
    data = wait_until(
        lambda: not error_sidecar(source) and sidecars_done(source),
        10,
        "the retried document done and its error sidecar gone, without a restart",
    )
    assert data["status"] == "ok"
    assert daemon.proc.poll() is None and len(events_named(daemon, "daemon_ready")) == 1


def test_ocr_hands_its_files_to_the_running_daemon(make_daemon, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(state / "control.sock"))  # what a killed daemon leaves: nobody listens on it
    stale.close()
    daemon = make_daemon().start()
    sock = state / "control.sock"
    info = os.stat(sock)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report = docs.write_pdf(
        elsewhere / "report.pdf", [[f"Page {n} of the report"] for n in range(1, 7)]
    )
    locked = docs.write_encrypted_pdf(elsewhere / "locked.pdf")
    proc = cli(daemon, "ocr", report, locked)
    assert proc.returncode == 1, proc.stderr  # exit codes as without a daemon: a document failed
    assert (
        f"handed 2 file(s) to the running daemon (pid {daemon.proc.pid}, engine tesseract)"
        in proc.stderr
    )
    assert re.search(r"report\.pdf: [1-6]/6 pages", proc.stderr), proc.stderr
    assert "locked.pdf: encrypted_pdf:" in proc.stderr and "hint:" in proc.stderr
    assert "1 done, 0 skipped, 1 failed" in proc.stdout
    # no engine here
    assert "engine_selected" not in proc.stderr and "tesseract.started" not in proc.stderr
    started = events_named(daemon, "job_started", uri=report.as_uri())
    assert len(started) == 1 and started[0]["source"].startswith("cli:")
    assert (
        sidecars_done(report)["status"] == "ok"
        and error_sidecar(locked)["error"]["kind"] == "encrypted_pdf"
    )
    assert "file://" not in cli(daemon, "status").stdout  # handed-over files never enter the ledger

    again = cli(daemon, "ocr", report)
    assert again.returncode == 0 and "0 done, 1 skipped, 0 failed" in again.stdout, again.stderr
    forced = cli(daemon, "ocr", "--force", report)
    assert forced.returncode == 0 and "1 done, 0 skipped, 0 failed" in forced.stdout, forced.stderr
    assert len(events_named(daemon, "job_started", uri=report.as_uri())) == 2

    # Another Tesseract language than the daemon's own, for these files only.
    german = docs.write_png(elsewhere / "brief.png", ["Sehr geehrte Damen und Herren"])
    asked = cli(daemon, "ocr", "--lang", "deu", german)
    assert asked.returncode == 0 and "handed 1 file(s)" in asked.stderr, asked.stderr
    assert sidecars_done(german)["engine"]["lang"] == "deu"
    own = cli(daemon, "ocr", "--force", german)
    assert own.returncode == 0 and sidecars_done(german)["engine"]["lang"] == "auto", own.stderr

    assert daemon.stop() == 0
    assert not sock.exists()


def test_status_shows_the_pages_of_running_documents_and_the_queue_by_inbox(
    plugin_daemon, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    daemon = plugin_daemon(
        engine_args={"delay": 1.5, "max_concurrency": 1},
        inboxes=[
            {"path": str(first), "settle_seconds": 0.3},
            {"path": str(second), "settle_seconds": 0.3},
        ],
        scheduler={"max_active_documents": 1},
    ).start()
    big = docs.write_pdf(first / "big.pdf", [[f"Page {n}"] for n in range(1, 13)], dpi=72)
    midway = re.compile(
        rf"^running: {re.escape(big.as_uri())} ([1-9]|1[01])/12 pages, about ([0-9]+) s left$", re.M
    )
    wait_until(
        lambda: midway.search(cli(daemon, "status").stdout),
        60,
        "the big document's pages in status",
    )
    for n in range(2):
        docs.write_png(second / f"small{n}.png", [f"Small {n}"])

    def both() -> str | None:
        out = cli(daemon, "status").stdout
        return out if f"queue: {second}: 0 running, 2 waiting" in out else None

    out = wait_until(both, 30, "the second inbox's documents waiting")
    assert f"daemon: running (pid {daemon.proc.pid}, engine plugin)" in out
    # the running document is not the oldest waiting: one of those that wait is
    assert f"oldest waiting: {(second / 'small').as_uri()}" in out, out
    assert f"queue: {first}: 1 running, 0 waiting" in out
    found = midway.search(out)
    assert found, out
    left, eta = 12 - int(found[1]), int(found[2])
    assert left * 1.5 / 3 <= eta <= left * 1.5 * 3, out  # the rate of the pages done: 1.5 s each


def _as_a_shell_starts_it() -> None:
    """Ctrl-C as a user's shell gives it: a test worker may run with SIGINT ignored or blocked, and
    a child inherits both (an ignored or blocked SIGINT never reaches the client)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_an_interrupted_ocr_stops_its_documents_in_the_daemon(
    plugin_daemon, tmp_path: Path
) -> None:
    daemon = plugin_daemon(engine_args={"delay": 1.0, "max_concurrency": 1}).start()
    slow = docs.write_pdf(tmp_path / "slow.pdf", [[f"Page {n}"] for n in range(1, 31)], dpi=72)
    said = tmp_path / "client.log"  # a file, not a pipe nobody reads while the client runs
    client = subprocess.Popen(
        [sys.executable, "-m", "ocrwatch", "ocr", str(slow), "--config", str(daemon.config_path)],
        stdout=subprocess.DEVNULL,
        stderr=said.open("wb"),
        preexec_fn=_as_a_shell_starts_it,
    )
    try:
        pages = re.compile(rf"running: {re.escape(slow.as_uri())} [1-9]\d*/30 pages")
        wait_until(
            lambda: pages.search(cli(daemon, "status").stdout),
            60,
            "the handed-over document running",
        )
        masks = [
            line
            for line in Path(f"/proc/{client.pid}/status").read_text().splitlines()
            if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
        ]
        client.send_signal(signal.SIGINT)
        try:
            assert client.wait(30) == 130
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the client did not stop on SIGINT: {masks}") from None
    finally:
        if client.poll() is None:
            client.kill()
    wait_until(
        lambda: events_named(daemon, "control_ocr_abandoned"),
        30,
        "the daemon noticing the client left",
    )
    wait_until(
        lambda: "running: " not in cli(daemon, "status").stdout,
        30,
        "the document stopped in the daemon",
    )
    assert sidecars_done(slow) is None and error_sidecar(slow) is None
    assert daemon.proc.poll() is None

    # An engine the daemon does not run: read here, by an engine of this run's own (Tesseract: no
    # GPU shared).
    page = docs.write_png(tmp_path / "page.png", ["Read here"])
    here = cli(daemon, "ocr", "--engine", "tesseract", page)
    assert here.returncode == 0, here.stderr
    assert "the running daemon reads with plugin, not tesseract: reading here" in here.stderr
    assert (
        "tesseract.started" in here.stderr and sidecars_done(page)["engine"]["name"] == "tesseract"
    )


def test_a_client_probing_the_lock_does_not_stop_a_daemon_starting(
    make_daemon, tmp_path: Path
) -> None:
    """A client tells whether a daemon runs by a shared lock held for an instant; a daemon starting
    meanwhile waits that instant out instead of refusing to start as if another daemon held the
    state."""
    daemon = make_daemon()
    daemon.state.mkdir(mode=0o700)
    lock = daemon.state / "daemon.lock"
    probe = open(lock, "a")  # noqa: SIM115
    fcntl.flock(probe.fileno(), fcntl.LOCK_SH)
    daemon.start(wait_ready=False)
    assert daemon.proc is not None
    fds = Path(f"/proc/{daemon.proc.pid}/fd")

    def lock_opened() -> bool:  # it tries the lock right after opening the file
        if daemon.proc.poll() is not None:
            raise AssertionError(
                f"the daemon exited with {daemon.proc.returncode}:\n{daemon.log_text()}"
            )
        with contextlib.suppress(OSError):
            return any(os.readlink(fd) == str(lock) for fd in fds.iterdir())
        return False

    wait_until(lock_opened, 60, "the daemon opening the lock file")
    threading.Timer(0.2, probe.close).start()  # let go while its first try has failed
    wait_until(daemon.ready, 60, "the daemon ready once the probe let go")
    assert "daemon: running" in cli(daemon, "status").stdout


def test_a_deep_state_dir_still_has_a_control_socket(make_daemon, tmp_path: Path) -> None:
    """``sun_path`` holds 107 bytes: a state_dir deeper than that is reached through its folder's
    descriptor."""
    deep = tmp_path.joinpath(*(["a-rather-long-folder-name"] * 5), "state")
    assert len(os.fsencode(deep / "control.sock")) > 108
    daemon = make_daemon(state_dir=str(deep)).start()
    picture = docs.write_png(tmp_path / "deep.png", ["Deep state"])
    proc = cli(daemon, "ocr", picture)
    assert proc.returncode == 0 and "handed 1 file(s)" in proc.stderr, proc.stderr
    assert f"daemon: running (pid {daemon.proc.pid}" in cli(daemon, "status").stdout
    assert daemon.stop() == 0 and not (deep / "control.sock").exists()


def test_a_malformed_request_gets_an_error_line_and_the_daemon_goes_on(make_daemon) -> None:
    daemon = make_daemon().start()

    def ask(line: bytes) -> list[dict[str, Any]]:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(str(daemon.state / "control.sock"))
            sock.sendall(line)
            with sock.makefile("rb") as answer:
                return [json.loads(event) for event in answer]

    for line in (b"not json\n", b"[1, 2]\n", b'{"op": "reboot"}\n', b'{"op": "ocr", "files": 3}\n'):
        answer = ask(line)
        assert len(answer) == 1 and answer[0]["event"] == "error", (line, answer)
    status = ask(b'{"op": "status"}\n')
    assert [event["event"] for event in status] == ["status", "end"]
    assert status[0]["daemon"] == {
        "pid": daemon.proc.pid,
        "state": "running",
        "engine": "tesseract",
        "listening": {"[metrics] listen": f"127.0.0.1:{daemon.port}"},
    }


def test_check_beside_the_running_daemon_passes_its_own_port_and_fails_a_strangers(
    make_daemon,
) -> None:
    """``ocrwatch check`` on a live host: the port the daemon holding state_dir listens on is its
    own (its status answer says so), one a stranger holds is still a failure; nothing but the table
    is printed, not even at the daemon's log level debug."""
    daemon = make_daemon().start()
    done = cli(daemon, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    own = (
        f"ok   [metrics] listen 127.0.0.1:{daemon.port} is held by the running daemon (pid "
        f"{daemon.proc.pid})"
    )
    assert own in done.stdout.splitlines(), done.stdout
    assert all(line.startswith(("ok   ", "FAIL ")) for line in done.stdout.splitlines()), (
        done.stdout
    )
    assert done.stderr == "", done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = daemon.config_path.read_text().replace(
            f"127.0.0.1:{daemon.port}", f"127.0.0.1:{port}"
        )
        daemon.config_path.write_text(config)
        done = cli(daemon, "check")
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [
        f"FAIL [metrics] listen 127.0.0.1:{port}: address already in use: stop what listens "
        f"there (another ocrwatch?), or set [metrics] listen to a free HOST:PORT"
    ], done.stdout
    assert daemon.stop() == 0
