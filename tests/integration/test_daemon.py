"""``ocrwatch run`` as a real process: real inotify/polling watchers, real pdftoppm, real
Tesseract."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from ocrwatch.results.assemble import ERROR_SCHEMA, JSON_SCHEMA
from tests.integration.conftest import (
    alive,
    children_named,
    error_sidecar,
    sidecars_done,
    wait_until,
)
from tests.support import docs

pytestmark = pytest.mark.integration

WORDS = ["Quarterly", "report", "invoice", "number", "forty", "two"]


def page_lines(tag: str) -> list[str]:
    return [f"Document {tag}", "Quarterly report invoice", "number forty two"]


def assert_complete(path: Path, expect_text: str | None = None) -> dict:
    data = sidecars_done(path)
    assert data is not None, f"no JSON sidecar for {path}"
    jsonschema.validate(data, JSON_SCHEMA)
    markdown = path.with_name(path.name + ".md").read_text()
    assert markdown.startswith("<!-- page 1 -->")
    assert data["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    if expect_text:
        assert expect_text.lower() in markdown.lower(), markdown
    return data


def no_torn_files(folder: Path) -> None:
    for sidecar in folder.rglob("*.json"):
        json.loads(sidecar.read_text())
    leftovers = [p for p in folder.rglob(".*ocrwatch-tmp-*")]
    assert not leftovers or all(p.name.startswith(".") for p in leftovers)


def test_drop_to_sidecar_and_the_many_ways_files_arrive(make_daemon, tmp_path: Path) -> None:
    daemon = make_daemon()
    inbox = daemon.inbox
    before = docs.write_png(inbox / "present before start.png", page_lines("before"))
    daemon.start()
    t0 = time.monotonic()
    one = docs.write_png(inbox / "one.png", page_lines("one"))
    wait_until(lambda: sidecars_done(one), 60, "one-page sidecar")
    drop_to_sidecar = time.monotonic() - t0
    print(f"drop-to-sidecar one page: {drop_to_sidecar:.2f}s")

    outside = tmp_path / "outside"
    outside.mkdir()
    moved_src = docs.write_pdf(
        outside / "moved.pdf", [page_lines("moved"), page_lines("moved two")]
    )
    os.rename(moved_src, inbox / "moved.pdf")

    (inbox / "a" / "b").mkdir(parents=True)
    nested = docs.write_jpeg(inbox / "a" / "b" / "Übersicht März 2026.jpg", page_lines("nested"))

    slow_bytes = (docs.write_pdf(outside / "slow.pdf", [page_lines("slow")])).read_bytes()
    slow = inbox / "slow copy.pdf"

    def slow_writer() -> None:
        with open(slow, "wb") as handle:
            handle.write(slow_bytes[: len(slow_bytes) // 2])
            handle.flush()
            time.sleep(2.5)
            handle.write(slow_bytes[len(slow_bytes) // 2 :])

    writer = threading.Thread(target=slow_writer)
    writer.start()
    bad = inbox / "not really.pdf"
    bad.write_bytes(b"MZ\x90\x00" + os.urandom(2000))
    empty = inbox / "empty.pdf"
    empty.write_bytes(b"")
    writer.join()

    for path in (before, moved_src.with_name("x"), nested, slow):
        if path.name == "x":
            path = inbox / "moved.pdf"
        wait_until(lambda p=path: sidecars_done(p), 120, f"sidecar for {path.name}")
    assert_complete(before, "before")
    assert_complete(one, "one")
    assert len(assert_complete(inbox / "moved.pdf")["pages"]) == 2
    assert_complete(nested, "nested")
    assert_complete(slow, "slow")
    for path, kind in ((bad, "not_a_document"), (empty, "empty_file")):
        error = wait_until(lambda p=path: error_sidecar(p), 60, f"error sidecar for {path.name}")
        jsonschema.validate(error, ERROR_SCHEMA)
        assert error["error"]["kind"] == kind
        assert not sidecars_done(path)
    assert bad.exists() and empty.exists()
    failed = [e for e in daemon.events() if e.get("event") == "job_failed"]
    assert {e["kind"] for e in failed} == {"not_a_document", "empty_file"}
    assert all(e.get("job_id") for e in failed)
    metrics = daemon.metrics()
    assert 'ocrwatch_documents_total{status="ok"}' in metrics
    assert daemon.stop() == 0


def test_kill_9_mid_batch_then_restart_completes_every_document(make_daemon) -> None:
    daemon = make_daemon(scheduler={"render_ahead": 4, "max_active_documents": 4})
    daemon.start()
    paths = []
    for index in range(12):
        pages = [page_lines(f"k{index} p{p}") for p in range(1 + index % 3)]
        paths.append(docs.write_pdf(daemon.inbox / f"batch {index:02d}.pdf", pages))
    wait_until(lambda: sum(1 for p in paths if sidecars_done(p)) >= 2, 120, "first documents done")
    daemon.kill()
    done_before = {p for p in paths if sidecars_done(p)}
    assert len(done_before) < len(paths), "the kill came too late to test anything"
    daemon.start()
    wait_until(lambda: all(sidecars_done(p) for p in paths), 240, "every document after restart")
    for path in paths:
        assert_complete(path)
        assert not error_sidecar(path)
    no_torn_files(daemon.inbox)
    assert daemon.stop() == 0
    resumed = [e for e in daemon.events() if e.get("event") == "daemon_ready"]
    assert resumed and resumed[-1]["resumed"] + len(done_before) >= 1
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        states = dict(db.execute("select state, count(*) from jobs group by state").fetchall())
    assert states == {"done": len(paths)}


def test_sigterm_drains_and_exits_zero_with_a_consistent_ledger(make_daemon) -> None:
    daemon = make_daemon()
    daemon.start()
    paths = [
        docs.write_pdf(daemon.inbox / f"t{i}.pdf", [page_lines(f"t{i}")] * 2) for i in range(4)
    ]
    wait_until(
        lambda: any(e.get("event") == "job_started" for e in daemon.events()), 30, "a job to start"
    )
    t0 = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(40) == 0
    assert time.monotonic() - t0 < 30
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
        rows = dict(db.execute("select key, state from jobs").fetchall())
    for path in paths:
        state = rows.get(path.resolve().as_uri())
        if sidecars_done(path):
            assert state == "done"
        else:
            assert state in (None, "queued", "rendering", "recognizing", "writing")
    daemon.start()
    wait_until(
        lambda: all(sidecars_done(p) for p in paths), 120, "remaining documents after restart"
    )
    assert daemon.stop() == 0


SHUTDOWN_TIMEOUT = 1.0


def terminated_in_time(daemon) -> float:
    """SIGTERM: exit 0 within ``shutdown_timeout`` + 5 s; the seconds it took."""
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(SHUTDOWN_TIMEOUT + 30) == 0
    took = time.monotonic() - started
    assert took <= SHUTDOWN_TIMEOUT + 5, took
    return took


@pytest.mark.parametrize("engine", ["tesseract", "hanging"])
def test_sigterm_on_a_busy_daemon_exits_within_shutdown_timeout_plus_5_s(
    make_daemon, plugin_daemon, engine
) -> None:
    """Documents rendering and in the engine (real Tesseract processes, or pages the engine never
    answers): SIGTERM ends the process within ``shutdown_timeout`` + 5 s, with exit 0, and its
    output stays JSON lines to the end: no traceback, no error, no stray line from a task cancelled
    on the way out. (A page a render worker finished as the stop came may still be logged after
    ``daemon_stopped``; one still rendering is killed.)"""
    daemon_cfg = {"shutdown_timeout": SHUTDOWN_TIMEOUT}
    if engine == "tesseract":
        daemon = make_daemon(daemon=daemon_cfg)
    else:
        daemon = plugin_daemon(
            "tests.support.fault_engines:HangingEngine",
            {"match": "", "max_concurrency": 4},
            daemon=daemon_cfg,
        )
    daemon.start()
    paths = [
        docs.write_pdf(
            daemon.inbox / f"busy {i}.pdf", [page_lines(f"busy {i} {n}") for n in range(6)]
        )
        for i in range(4)
    ]

    def recognizing() -> int:
        with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
            return db.execute("select count(*) from jobs where state = 'recognizing'").fetchone()[0]

    wait_until(lambda: recognizing() >= 2, 60, "documents in the engine")
    print(
        f"{engine}: SIGTERM to exit {terminated_in_time(daemon):.2f} s (shutdown_timeout "
        f"{SHUTDOWN_TIMEOUT} s)"
    )
    text = daemon.log_text()
    assert "Traceback" not in text
    lines = text.splitlines()
    not_json = [line for line in lines if not line.startswith("{")]
    assert not not_json, not_json
    events = [json.loads(line) for line in lines]
    after = events[[e["event"] for e in events].index("daemon_stopped") + 1 :]
    print(f"{engine}: after daemon_stopped: {[e['event'] for e in after]}")
    assert {e["event"] for e in after} <= {"page_rendered"}
    assert not [e for e in events if e["level"] in ("error", "critical")]
    assert any(e["event"] == "jobs_requeued_at_shutdown" for e in events)
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert all(state != "failed" for (state,) in db.execute("select state from jobs"))
    assert not [p for p in paths if error_sidecar(p)]


def test_sigterm_while_pdftoppm_hangs_kills_it_and_exits_in_time(
    make_daemon, tmp_path: Path
) -> None:
    """A page whose pdftoppm never ends (a stand-in that sleeps for a minute, well inside the render
    timeout): SIGTERM still exits 0 within ``shutdown_timeout`` + 5 s, and no pdftoppm is left
    behind. A worker thread waiting for the child cannot be cancelled; without killing the child,
    the exit waited for it."""
    fake = tmp_path / "bin" / "pdftoppm"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\ncase "$*" in *-singlefile*) exec sleep 60 ;; esac\nexec '
        f'{shutil.which("pdftoppm")} "$@"\n'
    )
    fake.chmod(0o755)
    daemon = make_daemon(
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT}, render={"timeout_seconds": 300}
    )
    daemon.start(env={"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    docs.write_pdf(daemon.inbox / "hangs.pdf", [page_lines("hangs")])
    hanging = wait_until(
        lambda: children_named(daemon.proc.pid, "sleep"), 30, "the stand-in pdftoppm running"
    )
    print(f"SIGTERM to exit with pdftoppm hanging: {terminated_in_time(daemon):.2f} s")
    assert not [pid for pid in hanging if alive(pid)]


def test_a_second_ctrl_c_while_draining_exits_at_once(plugin_daemon) -> None:
    """The first SIGINT drains (up to shutdown_timeout, 20 s here); a second one does not wait for
    it."""
    daemon = plugin_daemon(engine_args={"delay": 120.0})
    daemon.start()
    docs.write_png(daemon.inbox / "slow.png", page_lines("slow"))
    wait_until(
        lambda: any(e.get("event") == "job_started" for e in daemon.events()), 30, "a job to start"
    )
    daemon.signal(signal.SIGINT)
    wait_until(
        lambda: any(e.get("event") == "daemon_stopping" for e in daemon.events()), 10, "draining"
    )
    t0 = time.monotonic()
    daemon.signal(signal.SIGINT)
    assert daemon.proc.wait(10) == 130
    assert time.monotonic() - t0 < 5
    assert any(e.get("event") == "forced_exit" for e in daemon.events())
    assert not any(e.get("event") == "daemon_stopped" for e in daemon.events())


def test_polling_inbox_and_sighup_adds_an_inbox(make_daemon, tmp_path: Path) -> None:
    polled = tmp_path / "polled"
    daemon = make_daemon(inboxes=[{"path": str(polled), "polling": True, "settle_seconds": 0.3}])
    daemon.start()
    first = docs.write_png(polled / "polled.png", page_lines("polled"))
    wait_until(lambda: sidecars_done(first), 60, "sidecar in the polled inbox")
    assert any(
        e.get("event") == "inbox_watching" and "olling" in json.dumps(e) for e in daemon.events()
    )

    second_inbox = tmp_path / "added"
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(
        text + f'\n[[inbox]]\npath = "{second_inbox}"\nsettle_seconds = 0.3\n'
    )
    daemon.signal(signal.SIGHUP)
    wait_until(
        lambda: any(e.get("event") == "config_reloaded" for e in daemon.events()), 20, "reload"
    )
    wait_until(second_inbox.exists, 10, "new inbox created")
    added = docs.write_png(second_inbox / "added.png", page_lines("added"))
    wait_until(lambda: sidecars_done(added), 60, "sidecar in the added inbox")
    assert daemon.stop() == 0


def test_systemd_notifications(make_daemon, tmp_path: Path) -> None:
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.2)
    messages: list[str] = []
    daemon = make_daemon()
    daemon.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})

    def drain() -> list[str]:
        try:
            while True:
                messages.append(sock.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            pass
        return messages

    wait_until(
        lambda: "READY=1" in drain() and "WATCHDOG=1" in messages, 20, "READY=1 and WATCHDOG=1"
    )
    assert daemon.stop() == 0
    drain()
    assert "STOPPING=1" in messages
    sock.close()


def test_restart_skips_done_files_and_reprocesses_changed_ones(make_daemon) -> None:
    daemon = make_daemon()
    daemon.start()
    path = docs.write_png(daemon.inbox / "same.png", page_lines("same"))
    first = wait_until(lambda: sidecars_done(path), 60, "first sidecar")
    assert daemon.stop() == 0
    shutil.rmtree(daemon.state)
    daemon.start()
    time.sleep(2)
    assert sidecars_done(path)["timing"] == first["timing"], "unchanged file was processed again"
    docs.write_png(path, page_lines("changed"))
    wait_until(
        lambda: "changed" in path.with_name(path.name + ".md").read_text().lower(),
        60,
        "reprocessed",
    )
    assert daemon.stop() == 0


def test_one_page_documents_fill_the_pages_in_flight_beyond_64_open_documents(make_daemon) -> None:
    """``max_active_documents = "auto"`` follows the pages in flight: 70 one-page documents are all
    open at once when the engine takes 80 pages, where the old fixed 64 held the rest back."""
    daemon = make_daemon(scheduler={"max_inflight_pages": 80})
    daemon.start()
    (ready,) = [e for e in daemon.events() if e.get("event") == "scheduler_ready"]
    assert (ready["max_inflight"], ready["max_active_documents"], ready["render_ahead"]) == (
        80,
        80,
        40,
    )
    paths = [
        docs.write_png(
            daemon.inbox / f"card {index:02d}.png",
            docs.text_image([f"card {index}"], size=(600, 120)),
        )
        for index in range(70)
    ]

    def running() -> float:
        line = next(
            x
            for x in daemon.metrics().splitlines()
            if x.startswith('ocrwatch_active_documents{state="running"}')
        )
        return float(line.split()[-1])

    wait_until(lambda: running() > 64, 60, "more than 64 documents open at once")
    wait_until(lambda: all(sidecars_done(p) for p in paths), 120, "every one-page document")
    assert daemon.stop() == 0


def test_log_lines_name_their_job_and_a_restart_counts_the_files_done_before(make_daemon) -> None:
    """Each file submitted is said with its job_id; a PDF's pages rendered below the wanted DPI are
    said once, numbered as the sidecars number them; an empty file closed is failed once quiet, not
    after the probe's give-up; a restart that finds every file as it was says so in one line for the
    inbox, not a line a file."""
    # at 150 dpi a 300 pt page fits, a 1000 pt one does not
    daemon = make_daemon(render={"max_side": 1000})
    daemon.start()
    pngs = [docs.write_png(daemon.inbox / f"{tag}.png", page_lines(tag)) for tag in ("a", "b")]
    poster = docs.write_sized_pdf(
        daemon.inbox / "poster.pdf", [(300, 300), (1000, 1000), (300, 300)]
    )
    bad = daemon.inbox / "bad.pdf"
    bad.write_bytes(b"MZ\x90\x00" + os.urandom(2000))
    empty = daemon.inbox / "empty.pdf"
    empty.write_bytes(b"")
    for path in (*pngs, poster):
        wait_until(lambda p=path: sidecars_done(p), 60, f"sidecars of {path.name}")
    for path, kind in ((bad, "not_a_document"), (empty, "empty_file")):
        error = wait_until(lambda p=path: error_sidecar(p), 60, f"the error sidecar of {path.name}")
        assert error["error"]["kind"] == kind
    events = daemon.events()
    [said] = [e for e in events if e["event"] == "local_submitted" and e["path"] == str(empty)]
    # decided by its close, not given up on
    assert said["probe"] == "empty" and said["bytes"] == 0, said
    started = {e["uri"]: e["job_id"] for e in events if e["event"] == "job_started"}
    submitted = {e["path"]: e["job_id"] for e in events if e["event"] == "local_submitted"}
    assert submitted == {str(path): started[path.as_uri()] for path in (*pngs, poster, bad, empty)}
    [lowered] = [e for e in events if e["event"] == "page_dpi_lowered"]
    assert (lowered["job_id"], lowered["uri"], lowered["pages"]) == (
        started[poster.as_uri()],
        poster.as_uri(),
        "2",
    )
    assert (lowered["level"], lowered["count"], lowered["of"], lowered["wanted"]) == (
        "info",
        1,
        3,
        150.0,
    )
    assert daemon.stop() == 0
    # found at a start, it waits the give-up
    for path in (
        empty,
        empty.with_name("empty.pdf.error.json"),
    ):
        path.unlink()

    daemon.start()
    said = wait_until(
        lambda: [e for e in daemon.events() if e["event"] == "local_unchanged"], 30, "the count"
    )
    assert said == [
        {**said[0], "inbox": str(daemon.inbox), "done": 3, "failed": 1, "level": "info"}
    ]
    names = ("a.png", "b.png", "poster.pdf", "bad.pdf", "empty.pdf")
    per_file = [
        e
        for e in daemon.events()
        if e["level"] != "debug" and any(n in json.dumps(e) for n in names)
    ]
    assert per_file == [], per_file
    assert len([e for e in daemon.events() if e["event"] == "job_already_done"]) == 3  # at debug
    assert daemon.stop() == 0
