"""Crash safety at scale: ``kill -9`` at random moments never loses, tears or needlessly repeats
work.

The daemon is the real one; its engine is ``tests.support.hardening_engines:CountingEngine`` (an
echo engine
that appends a line per recognition to a file), because Tesseract on 200 documents times eleven
restarts would take minutes on a small machine and adds nothing to what is tested here: the ledger,
the scheduler, the sinks and the restart path.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

from ocrwatch.results.assemble import JSON_SCHEMA
from ocrwatch.safefs import TMP_MARKER
from tests.integration.conftest import error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.hardening_engines import job_id_of

pytestmark = pytest.mark.integration

COUNTING = "tests.support.hardening_engines:CountingEngine"
DOCUMENTS = 200
KILLS = 10


def make_documents(inbox: Path) -> dict[Path, int]:
    """200 documents: 150 one-page PNGs and 50 PDFs of 2-4 pages, each with its own text. -> pages
    per path"""
    made = {}
    for number in range(DOCUMENTS):
        if number % 4 == 3:
            pages = 2 + number % 3
            images = [
                docs.text_image([f"doc {number} page {p + 1}"], size=(360, 120), font_px=28)
                for p in range(pages)
            ]
            made[docs.write_pdf(inbox / f"doc {number:03d}.pdf", images)] = pages
        else:
            image = docs.text_image([f"doc {number}"], size=(360, 120), font_px=28)
            made[docs.write_png(inbox / f"doc {number:03d}.png", image)] = 1
    return made


def recognitions(log: Path) -> list[tuple[str, int, str, int]]:
    """(start|done, pid, job id, page index) for every line of the engine's log."""
    out = []
    for line in log.read_text().splitlines():
        what, pid, request_id = line.split()
        jid, page, _attempt = request_id.split("/")
        out.append((what, int(pid), jid, int(page[1:])))
    return out


def test_200_documents_survive_10_random_kill_9s(plugin_daemon, tmp_path: Path) -> None:
    seed = int(os.environ.get("OCRWATCH_CRASH_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"crash-safety seed {seed} (set OCRWATCH_CRASH_SEED to replay)")
    log = tmp_path / "recognitions.log"
    daemon = plugin_daemon(
        COUNTING,
        {"log": str(log), "delay": 0.04, "max_concurrency": 4},
        scheduler={"max_active_documents": 8, "render_ahead": 8},
        # The crash-loop guard fails a document interrupted more than `attempts` times; here the
        # test is what kills the daemon, so the guard must not fire before the test runs out of
        # kills.
        retry={"attempts": KILLS + 2, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0},
    )
    pages_of = make_documents(daemon.inbox)
    by_jid = {job_id_of(path): path for path in pages_of}
    source_hashes = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in pages_of}

    def finished() -> set[Path]:
        return {p for p in pages_of if p.with_name(p.name + ".json").exists()}

    pids: list[int] = []
    done_at_kill: list[set[Path]] = []  # documents whose JSON sidecar existed when run i was killed
    for kill in range(KILLS):
        daemon.start()
        pids.append(daemon.proc.pid)
        # Leave documents for the later kills: each restart also finishes what was in flight at the
        # kill.
        target = min(len(finished()) + rng.randint(3, 14), DOCUMENTS - 12 * (KILLS - kill))
        wait_until(
            lambda t=target: len(finished()) >= t,
            60,
            f"progress before kill {kill + 1}",
            interval=0.02,
        )
        time.sleep(rng.uniform(0, 0.15))
        daemon.kill()
        done_at_kill.append(finished())
        print(f"kill {kill + 1}: {len(done_at_kill[-1])} of {DOCUMENTS} done")
        assert len(done_at_kill[-1]) < DOCUMENTS, "the kills came too late to test anything"
    daemon.start()
    pids.append(daemon.proc.pid)
    wait_until(lambda: len(finished()) == DOCUMENTS, 120, "every document after the last restart")
    assert daemon.stop() == 0

    # 200 of 200, complete, never torn, nothing failed.
    for path, pages in pages_of.items():
        data = sidecars_done(path)
        jsonschema.validate(data, JSON_SCHEMA)
        assert data["status"] == "ok" and len(data["pages"]) == pages
        assert (
            data["source"]["sha256"]
            == source_hashes[path]
            == hashlib.sha256(path.read_bytes()).hexdigest()
        )
        markdown = path.with_name(path.name + ".md").read_text()
        assert [f"<!-- page {n + 1} -->" in markdown for n in range(pages)] == [True] * pages
        assert not error_sidecar(path)
    leftovers = [p.name for p in daemon.inbox.iterdir() if TMP_MARKER in p.name]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    assert not list((daemon.state / "tmp").iterdir()), "session folders left behind"
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
        assert dict(db.execute("select state, count(*) from jobs group by state").fetchall()) == {
            "done": DOCUMENTS
        }

    # No repeated work beyond what was in flight: a document finished before a kill is never
    # recognised again, and a page recognised twice belongs to a document that was in flight at a
    # kill.
    run_of = {pid: index for index, pid in enumerate(pids)}
    runs_by_doc: dict[Path, set[int]] = defaultdict(set)
    done_count: dict[tuple[Path, int], int] = defaultdict(int)
    for what, pid, jid, page in recognitions(log):
        path = by_jid[jid]
        runs_by_doc[path].add(run_of[pid])
        if what == "done":
            done_count[path, page] += 1
    assert {path for path, _ in done_count} == set(pages_of)
    for path, runs in runs_by_doc.items():
        for run in range(len(done_at_kill)):
            if path in done_at_kill[run]:
                assert max(runs) <= run, (
                    f"{path.name} was done before kill {run + 1} but recognised again"
                )
    in_flight_at_a_kill = {
        path
        for run, done in enumerate(done_at_kill)
        for path, runs in runs_by_doc.items()
        if run in runs and path not in done
    }
    repeated = {key: count for key, count in done_count.items() if count > 1}
    assert {path for path, _ in repeated} <= in_flight_at_a_kill
    total = sum(done_count.values())
    needed = sum(pages_of.values())
    print(
        f"{DOCUMENTS} documents, {needed} pages, {KILLS} kills: {total} recognitions, "
        f"{total - needed} repeated "
        f"(documents in flight at a kill: {len(in_flight_at_a_kill)})"
    )
    # Each kill can cost at most the documents open at that moment (max_active_documents = 8).
    assert len(in_flight_at_a_kill) <= 8 * KILLS
    events = daemon.all_events()
    assert not [e for e in events if e.get("event") == "job_failed"]
    assert sum(e.get("resumed", 0) for e in events if e.get("event") == "daemon_ready") >= 1


def test_a_kill_between_the_sidecars_and_the_ledger_is_not_redone(
    plugin_daemon, tmp_path: Path
) -> None:
    """The window the random kills rarely hit, made exact: the sidecars are written, the ledger
    still says ``writing``. On restart the document is recognised as done from its sidecar, not
    processed again."""
    log = tmp_path / "recognitions.log"
    daemon = plugin_daemon(COUNTING, {"log": str(log)})
    daemon.start()
    path = docs.write_png(
        daemon.inbox / "written.png", docs.text_image(["written"], size=(360, 120), font_px=28)
    )
    first = wait_until(lambda: sidecars_done(path), 30, "sidecars")
    daemon.kill()
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        db.execute("update jobs set state = 'writing', finished_at = null")
    lines = log.read_text()
    daemon.start()
    wait_until(lambda: any(e.get("event") == "daemon_ready" for e in daemon.events()), 20, "ready")
    time.sleep(1.5)
    assert log.read_text() == lines, "the document was recognised again"
    assert sidecars_done(path)["timing"] == first["timing"]
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert db.execute("select state from jobs").fetchall() == [("done",)]
    assert daemon.stop() == 0


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(
    plugin_daemon, tmp_path: Path
) -> None:
    """Two daemons sharing a ledger would process every document twice; the second one says so and
    exits 2."""
    log = tmp_path / "recognitions.log"
    first = plugin_daemon(COUNTING, {"log": str(log)})
    first.start()
    (first.state / "tmp" / "job-keep").mkdir()
    second = plugin_daemon(COUNTING, {"log": str(log)})
    second.start(wait_ready=False)
    assert second.proc.wait(30) == 2
    assert "in use by another running ocrwatch" in second.log_text()
    assert (first.state / "tmp" / "job-keep").exists(), (
        "the second daemon touched the first one's temporaries"
    )
    assert first.ready()
    first.kill()
    json.dumps(first.events())  # the first daemon's log is intact JSON lines
    # A kill releases the lock: the next start succeeds and clears the old temporaries.
    second.start()
    assert not (second.state / "tmp" / "job-keep").exists()
    assert second.stop() == 0


# --- the crash-loop bound counts unclean ends only ------------------------------------------------

SLOW_PAGES = 12


def slow_document_daemon(plugin_daemon):
    """One 12-page PDF at half a second a page, one page at a time: about 6 s of work, so a stop a
    second after its recognition began always interrupts it. Three attempts, so a fourth
    interruption would exceed them."""
    daemon = plugin_daemon(
        engine_args={"delay": 0.5, "max_concurrency": 1},
        daemon={"shutdown_timeout": 0.5},
        retry={"attempts": 3, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0},
    )
    pages = [
        docs.text_image([f"long page {n + 1}"], size=(360, 120), font_px=28)
        for n in range(SLOW_PAGES)
    ]
    return daemon, docs.write_pdf(daemon.inbox / "long.pdf", pages)


def ledger_row(daemon, path: Path) -> tuple[str, int] | None:
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        return db.execute(
            "select state, attempts from jobs where key = ?", (path.resolve().as_uri(),)
        ).fetchone()


def interrupt_while_recognizing(daemon, path: Path, how: str) -> int:
    """Start the daemon, wait until the document's pages are being recognised, end the daemon:
    ``term`` (a clean stop, as systemctl restart does) or ``kill`` (kill -9). -> the attempts the
    ledger held meanwhile"""
    ledger = daemon.state / "ledger.sqlite3"
    # a kill leaves "recognizing" behind
    before = ledger_row(daemon, path) if ledger.exists() else None
    daemon.start()
    state, attempts = wait_until(
        lambda: (
            (row := ledger_row(daemon, path)) != before
            and row
            and row[0] in ("recognizing", "failed")
            and row
        ),
        60,
        "the document's recognition to begin",
    )
    assert state == "recognizing", f"the document failed at restart: {error_sidecar(path)}"
    if how == "term":
        assert daemon.stop() == 0
        assert any(e.get("event") == "job_interrupted" for e in daemon.events())
    else:
        daemon.kill()
    return attempts


def test_graceful_restarts_are_not_crashes(plugin_daemon) -> None:
    """Five clean stops in the middle of a long document (more than ``[retry] attempts``): each
    gives its attempt back, and the document still ends ``ok`` on the next start."""
    daemon, path = slow_document_daemon(plugin_daemon)
    seen = [interrupt_while_recognizing(daemon, path, "term") for _ in range(5)]
    assert seen == [1] * 5, seen
    assert ledger_row(daemon, path) == ("recognizing", 0)  # unfinished, no attempt spent
    daemon.start()
    data = wait_until(
        lambda: sidecars_done(path), 60, "the long document after five clean restarts"
    )
    assert data["status"] == "ok" and len(data["pages"]) == SLOW_PAGES
    assert not error_sidecar(path)
    wait_until(
        lambda: ledger_row(daemon, path) == ("done", 1),
        10,
        "the ledger row marked done, one attempt",
    )
    assert daemon.stop() == 0


def test_kill_9_past_the_attempts_ends_in_crash_loop_and_clean_stops_do_not_count(
    plugin_daemon,
) -> None:
    """Clean stops between the kills change nothing: the third kill -9 spends the third attempt, and
    the next start fails the document as ``crash_loop`` rather than taking the daemon down once
    more."""
    daemon, path = slow_document_daemon(plugin_daemon)
    seen = [interrupt_while_recognizing(daemon, path, how) for how in ("term", "kill") * 3]
    assert seen == [1, 1, 2, 2, 3, 3], seen
    daemon.start()
    error = wait_until(lambda: error_sidecar(path), 60, "the crash-loop error sidecar")["error"]
    assert error["kind"] == "crash_loop" and "3 attempts used up" in error["message"]
    assert not sidecars_done(path)
    # The error sidecar is written before the ledger records the failure.
    wait_until(lambda: ledger_row(daemon, path)[0] == "failed", 30, "the failure in the ledger")
    assert daemon.stop() == 0
