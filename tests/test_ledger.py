"""The ledger against real SQLite files: admission, states, resume (also after kill -9), retry,
locking."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from ocrwatch.errors import ConfigError, TransientError
from ocrwatch.sources.base import Job, LocalFile, S3Object
from ocrwatch.store import ledger as ledger_module
from ocrwatch.store import ledger_schema
from ocrwatch.store.ledger import Fingerprint, Ledger, StateUnusable, same_content
from tests.support import ledgers

REPO = Path(__file__).resolve().parent.parent
ERROR = {"kind": "corrupt_pdf", "message": "trailer missing", "retryable": False}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ledger.sqlite3"


@pytest.fixture
def ledger(db: Path) -> Iterator[Ledger]:
    with Ledger(db) as ledger:
        yield ledger


def local_job(tmp_path: Path, name: str) -> Job:
    return Job(
        origin=LocalFile(path=tmp_path / "inbox" / name, inbox=tmp_path / "inbox"),
        source="inbox",
        priority=10,
    )


def fp(size: int = 100, mtime_ns: int | None = 1, sha256: str | None = "aa") -> Fingerprint:
    return Fingerprint(size=size, mtime_ns=mtime_ns, sha256=sha256)


def spawn(code: str) -> subprocess.Popen[str]:
    """A Python child that has the repository on its path; its stdout is read line by line."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def hold(db: Path, begin: str, seconds: float) -> subprocess.Popen[str]:
    """Another process holding a transaction on the ledger (as a stuck ``sqlite3`` shell would);
    returns once held."""
    child = spawn(
        f"""
        import sqlite3, time
        conn = sqlite3.connect({str(db)!r}, isolation_level=None)
        conn.execute({begin!r})
        conn.execute("SELECT count(*) FROM jobs").fetchone()
        print("held", flush=True)
        time.sleep({seconds})
        conn.execute("COMMIT")
        """
    )
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


# --- pure helpers ---------------------------------------------------------------------------------


def test_same_content_uses_the_strongest_evidence_both_carry() -> None:
    # touched, same bytes
    assert same_content(fp(sha256="aa", mtime_ns=1), fp(sha256="aa", mtime_ns=2))
    assert not same_content(fp(sha256="aa"), fp(sha256="bb"))
    assert not same_content(fp(size=1), fp(size=2))
    # the cheap scan check
    assert same_content(fp(sha256="aa", mtime_ns=5), fp(sha256=None, mtime_ns=5))
    assert not same_content(fp(sha256="aa", mtime_ns=5), fp(sha256=None, mtime_ns=6))
    s3 = Fingerprint(size=9, mtime_ns=None, sha256=None, etag='"e1"', version_id="v1")
    assert same_content(
        s3, Fingerprint(size=9, mtime_ns=None, sha256=None, etag='"e1"', version_id="v1")
    )
    assert not same_content(
        s3, Fingerprint(size=9, mtime_ns=None, sha256=None, etag='"e2"', version_id="v1")
    )
    # cannot tell
    assert not same_content(fp(mtime_ns=None, sha256=None), fp(mtime_ns=None, sha256=None))
    # never hashed (over its byte budget): its signature, inode and ctime too
    seen = Fingerprint(size=9, mtime_ns=5, sha256=None, inode=7, ctime_ns=8)
    assert same_content(seen, Fingerprint(9, 5, None, inode=7, ctime_ns=8))
    assert not same_content(seen, Fingerprint(9, 5, None, inode=70, ctime_ns=80))  # replaced


# --- admission and states -------------------------------------------------------------------------


def test_admit_new_then_skip_then_readmit_on_change(
    tmp_path: Path, db: Path, ledger: Ledger
) -> None:
    job = local_job(tmp_path, "a.pdf")
    assert ledger.admit(job, fp())
    # still waiting in the queue: start it (the daemon dedups running jobs)
    assert ledger.admit(job, fp())
    ledger.set_state(job.key, "rendering")
    assert not ledger.admit(job, fp())  # taken
    ledger.record_attempt(job.key, ERROR)
    ledger.mark_done(job.key)
    assert not ledger.admit(job, fp(mtime_ns=99))  # touched only: still done, fingerprint refreshed
    row = ledger.known(job.key)
    assert (
        row is not None
        and row.state == "done"
        and row.fingerprint.mtime_ns == 99
        and row.fingerprint.sha256 == "aa"
    )

    assert ledger.admit(job, fp(sha256="bb"))  # new content: processed again from scratch
    row = ledger.known(job.key)
    assert row is not None
    assert (row.state, row.attempts, row.last_error, row.finished_at) == ("queued", 0, None, None)
    assert row.fingerprint == fp(sha256="bb")

    ledger.mark_failed(job.key, ERROR)
    assert not ledger.admit(job, fp(sha256="bb"))  # failed, same content: left failed
    assert ledger.admit(job, fp(size=101, sha256="cc"))  # failed, changed: tried again
    assert ledger.known("file:///nowhere") is None
    assert (db.parent.stat().st_mode & 0o777) == 0o700


def test_state_transitions_and_attempts(tmp_path: Path, ledger: Ledger) -> None:
    job = local_job(tmp_path, "b.pdf")
    ledger.admit(job, fp())
    assert ledger.record_attempt(job.key, None) == 1
    ledger.set_state(job.key, "rendering", pages_total=12)
    ledger.set_state(job.key, "recognizing", pages_done=5)
    row = ledger.known(job.key)
    assert row is not None and (row.state, row.pages_total, row.pages_done, row.attempts) == (
        "recognizing",
        12,
        5,
        1,
    )
    assert row.updated_at >= row.created_at

    transient = {"kind": "engine_dead", "message": "CUDA error", "retryable": True}
    assert ledger.record_attempt(job.key, transient) == 2
    ledger.set_state(job.key, "queued")
    assert ledger.record_attempt(job.key, None) == 3  # counting a start keeps the last error
    row = ledger.known(job.key)
    assert row is not None and row.last_error == transient and row.state == "queued"

    ledger.set_state(job.key, "writing")
    ledger.mark_done(job.key)
    row = ledger.known(job.key)
    assert row is not None and row.state == "done" and row.finished_at is not None

    with pytest.raises(ValueError):
        ledger.set_state(job.key, "lost")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ledger.set_state(job.key, "queued", attempts=0)
    with pytest.raises(TypeError):
        ledger.set_state(job.key, "queued", next_attempt_at=123.0)
    with pytest.raises(KeyError):
        ledger.mark_done("file:///nowhere")
    with pytest.raises(KeyError):
        ledger.record_attempt("file:///nowhere", None)


def test_an_attempt_a_clean_shutdown_interrupted_is_given_back(
    tmp_path: Path, ledger: Ledger
) -> None:
    job = local_job(tmp_path, "long.pdf")
    ledger.admit(job, fp())
    assert ledger.record_attempt(job.key, None) == 1
    ledger.set_state(job.key, "recognizing", pages_total=300)
    ledger.release_attempt(job.key)
    row = ledger.known(job.key)
    # still unfinished: it resumes
    assert row is not None and (row.attempts, row.state) == (0, "recognizing")
    ledger.release_attempt(job.key)
    assert ledger.record_attempt(job.key, None) == 1  # never below zero
    with pytest.raises(KeyError):
        ledger.release_attempt("file:///nowhere")


def test_unfinished_jobs_resume_after_reopen(tmp_path: Path, db: Path) -> None:
    s3 = Job(
        origin=S3Object(bucket="b", key="in/x y.pdf", etag='"e"', version_id="v7", size=10),
        source="bucket",
        prompt="free",
        max_bytes=1 << 20,
        max_pages=5,
        receipt="r-1",
    )
    local = [local_job(tmp_path, f"{i}.pdf") for i in range(4)]
    with Ledger(db) as ledger:
        ledger.admit(
            s3, Fingerprint(size=10, mtime_ns=None, sha256=None, etag='"e"', version_id="v7")
        )
        for job in local:
            ledger.admit(job, fp())
        ledger.set_state(local[0].key, "recognizing", pages_total=3, pages_done=1)
        ledger.mark_done(local[1].key)
        ledger.mark_failed(local[2].key, ERROR)

    with Ledger(db) as ledger:
        resumed = ledger.unfinished()
    assert [r.key for r in resumed] == [s3.key, local[0].key, local[3].key]  # oldest first
    assert resumed[0].job == s3 and resumed[0].key == "s3://b/in/x y.pdf?versionId=v7"
    assert resumed[1].job == local[0] and (resumed[1].state, resumed[1].pages_done) == (
        "recognizing",
        1,
    )


def test_retry_with_selectors(tmp_path: Path, ledger: Ledger) -> None:
    names = ["a.pdf", "sub/b.pdf", "sub/c.pdf", "subway.pdf", "ok.pdf"]
    jobs = {n: local_job(tmp_path, n) for n in names}
    s3 = Job(origin=S3Object(bucket="b", key="scans/d.pdf", version_id="v1"), source="bucket")
    for job in [*jobs.values(), s3]:
        ledger.admit(job, fp())
        ledger.record_attempt(job.key, ERROR)
        ledger.mark_failed(job.key, ERROR)
    ledger.set_state(jobs["ok.pdf"].key, "done")

    inbox = tmp_path / "inbox"
    # a folder: everything below it, not "subway.pdf"
    assert ledger.retry([str(inbox / "sub")]) == 2
    # a path; an S3 URI at any version
    assert ledger.retry([str(inbox / "a.pdf"), "s3://b/scans/d.pdf"]) == 2
    assert ledger.retry([str(inbox / "a.pdf")]) == 0  # no longer failed
    assert ledger.admit(jobs["a.pdf"], fp())  # the running daemon's next scan starts it
    row = ledger.known(jobs["sub/b.pdf"].key)
    assert row is not None and (row.state, row.attempts, row.finished_at) == ("queued", 0, None)
    assert ledger.retry() == 1  # the rest: subway.pdf; the done job is untouched
    assert ledger.summary()["counts"] == {
        "queued": 5,
        "rendering": 0,
        "recognizing": 0,
        "writing": 0,
        "done": 1,
        "failed": 0,
    }


def test_summary(tmp_path: Path, ledger: Ledger) -> None:
    empty = ledger.summary()
    assert (
        set(empty["counts"].values()) == {0}
        and empty["oldest_waiting"] is None
        and empty["last_errors"] == []
    )
    jobs = [local_job(tmp_path, f"{i}.pdf") for i in range(3)]
    for job in jobs:
        ledger.admit(job, fp())
    ledger.mark_failed(jobs[0].key, ERROR)
    ledger.record_attempt(
        jobs[1].key, {"kind": "engine_dead", "message": "boom", "retryable": True}
    )
    summary = ledger.summary(errors=5)
    assert summary["counts"]["queued"] == 2 and summary["counts"]["failed"] == 1
    assert summary["oldest_waiting"]["key"] == jobs[1].key and summary["oldest_waiting"]["age"] >= 0
    assert [(e["key"], e["state"], e["kind"], e["message"]) for e in summary["last_errors"]] == [
        (jobs[1].key, "queued", "engine_dead", "boom"),
        (jobs[0].key, "failed", "corrupt_pdf", "trailer missing"),
    ]
    assert len(ledger.summary(errors=1)["last_errors"]) == 1
    # a running daemon's job past queued is running, not waiting: the next queued one waits longest
    ledger.set_state(jobs[1].key, "rendering")
    assert ledger.summary()["oldest_waiting"]["key"] == jobs[1].key  # no daemon: all wait
    assert ledger.summary(waiting=("queued",))["oldest_waiting"]["key"] == jobs[2].key


def test_newer_schema_is_refused(db: Path) -> None:
    Ledger(db).close()
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StateUnusable, match="schema version 99"):
        Ledger(db)


@pytest.mark.parametrize("breaker", list(ledgers.BREAKERS))
def test_a_broken_ledger_is_refused_at_open_and_left_as_it_is(
    tmp_path: Path, db: Path, breaker: str
) -> None:
    """Garbage, a copy cut short, a page damaged in the middle, a newer schema: each stops the open
    with the file's name and what to do (a ``ConfigError``: exit 2), and the file is not touched, so
    it can be examined."""
    ledgers.make_ledger(db, tmp_path / "inbox")
    ledgers.BREAKERS[breaker](db)
    before = db.read_bytes()
    with pytest.raises(StateUnusable) as caught:
        Ledger(db)
    assert isinstance(caught.value, ConfigError) and str(db) in caught.value.message
    assert str(db) in caught.value.hint or "upgrade" in caught.value.hint
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.iterdir()) == [db.name]


def test_rows_hidden_by_a_damaged_page_are_caught_by_the_check_at_open(
    tmp_path: Path, db: Path
) -> None:
    """The damage that no query reports: rows are silently missing (a done document would be
    processed again, a queued one never resumed). Only the whole-file check at open sees it."""
    jobs = ledgers.make_ledger(db, tmp_path / "inbox")
    ledgers.hide_rows_in_the_middle(db)
    with closing(sqlite3.connect(db)) as conn:
        found = {row[0] for row in conn.execute("SELECT key, job FROM jobs")}
    missing = [job for job in jobs if job.key not in found]
    assert len(missing) == 4  # and no error from SQLite
    with pytest.raises(StateUnusable, match="is damaged"):
        Ledger(db)


def test_a_version_1_ledger_opens_and_loses_next_attempt_at(tmp_path: Path, db: Path) -> None:
    """Ledgers written before next_attempt_at was dropped open in place, with their rows and errors
    intact."""
    job = local_job(tmp_path, "old.pdf")
    db.parent.mkdir(mode=0o700)
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(ledger_schema.MIGRATIONS[0])
        conn.execute(
            "INSERT INTO jobs (key, state, attempts, last_error, error_at, job, fp_size, "
            "fp_sha256, created_at, updated_at, finished_at, next_attempt_at) VALUES (?, 'failed', "
            "2, ?, 5.0, ?, 100, 'aa', 1.0, 2.0, 3.0, 4.0)",
            (job.key, json.dumps(ERROR), ledger_module._dump_job(job)),
        )
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    with Ledger(db) as ledger:
        row = ledger.known(job.key)
        assert row is not None and (row.state, row.attempts, row.last_error) == ("failed", 2, ERROR)
        assert row.job == job and row.fingerprint == fp(mtime_ns=None)
        assert ledger.retry() == 1 and [r.key for r in ledger.unfinished()] == [job.key]
    with closing(sqlite3.connect(db)) as conn:
        columns = [column[1] for column in conn.execute("PRAGMA table_info(jobs)")]
        assert "next_attempt_at" not in columns and "finished_at" in columns
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        assert version == ledger_module.SCHEMA_VERSION == 5
        indexes = {index[1] for index in conn.execute("PRAGMA index_list(jobs)")}
        assert {"jobs_by_state", "jobs_by_error", "jobs_waiting"} <= indexes


def test_a_version_3_ledger_gets_source_and_priority_columns_from_each_rows_json(
    tmp_path: Path, db: Path
) -> None:
    """The queue reads source and priority as columns; older rows have them only in their JSON."""
    db.parent.mkdir(mode=0o700)
    jobs = [local_job(tmp_path, f"old-{n:04d}.pdf") for n in range(2500)]  # more than one batch
    jobs[7].priority = 90
    with closing(sqlite3.connect(db)) as conn, conn:
        for script in ledger_schema.MIGRATIONS[:3]:
            conn.executescript(script)
        conn.executemany(
            "INSERT INTO jobs (key, state, job, fp_size, created_at, updated_at)"
            " VALUES (?, 'queued', ?, 1, ?, 0)",
            [(job.key, ledger_module._dump_job(job), float(n)) for n, job in enumerate(jobs)],
        )
        conn.execute("PRAGMA user_version = 3")
    with Ledger(db) as ledger:
        first = [row.key for row in ledger.waiting(3, ["inbox"], [])]
        assert first == [jobs[7].key, jobs[0].key, jobs[1].key]
        assert ledger.backlog(["inbox"], [jobs[0].key]) == (2499, 1.0)
        assert ledger.waiting(3, ["s3:0"], []) == []
    with closing(sqlite3.connect(db)) as conn:
        filled = "SELECT count(*) FROM jobs WHERE source = 'inbox' AND priority IS NOT NULL"
        assert conn.execute(filled).fetchone() == (2500,)


def test_waiting_jobs_come_out_by_priority_then_age_through_the_index(
    tmp_path: Path, ledger: Ledger
) -> None:
    """The dispatcher's read costs the rows it passes over, not the backlog: the unfinished rows are
    never sorted."""
    names = ("urgent", "a", "b", "done")
    urgent, first, second, done = (local_job(tmp_path, f"{name}.pdf") for name in names)
    urgent.priority = 80
    for job in (first, second, done, urgent):
        assert ledger.admit(job, fp())
    ledger.mark_done(done.key)
    ledger.set_state(first.key, "recognizing")  # left mid-stage by a process that ended: resumed
    order = [row.key for row in ledger.waiting(10, ["inbox"], [])]
    assert order == [urgent.key, first.key, second.key]
    rest = [row.key for row in ledger.waiting(10, ["inbox"], [urgent.key, first.key])]
    assert rest == [second.key]
    assert ledger.waiting(10, ["other"], []) == []
    count, oldest = ledger.backlog(["inbox"], [urgent.key])
    assert count == 2 and oldest == ledger.known(first.key).created_at
    assert ledger.backlog(["inbox"], [urgent.key, first.key, second.key]) == (0, None)
    with closing(sqlite3.connect(ledger.path)) as conn:
        where, params = ledger_module._waiting_where(["inbox"], [urgent.key])
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT * FROM jobs INDEXED BY jobs_waiting WHERE {where}"
                " ORDER BY priority DESC, created_at, source, key LIMIT 1",
                params,
            )
        )
        counted = " ".join(
            str(row[-1])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT count(*), min(created_at) FROM jobs"
                f" INDEXED BY jobs_waiting WHERE {where}",
                params,
            )
        )
    assert "jobs_waiting" in plan and "TEMP B-TREE" not in plan, plan
    assert "COVERING INDEX jobs_waiting" in counted, counted  # the count never reads the rows


def test_a_queued_job_admitted_again_is_stored_as_handed_over_last(
    tmp_path: Path, ledger: Ledger
) -> None:
    """It waits in the ledger: a redelivered SQS message's new receipt is what acknowledges it when
    it runs."""
    origin = S3Object(bucket="b", key="k.pdf", etag='"e"', size=3)
    first = Job(origin=origin, source="s3:0", receipt="r1")
    again = Job(origin=first.origin, source="s3:0", receipt="r2", priority=70)
    assert ledger.admit(first, fp(size=3))
    assert ledger.admit(again, fp(size=3))
    (row,) = ledger.waiting(5, ["s3:0"], [])
    assert (row.job.receipt, row.job.priority) == ("r2", 70)
    ledger.mark_done(first.key)
    assert not ledger.admit(first, fp(size=3))
    assert ledger.known(first.key).job.receipt == "r2"  # a finished row keeps the job it ran


def test_a_name_that_is_not_utf8_round_trips_through_the_ledger(
    tmp_path: Path, ledger: Ledger
) -> None:
    job = local_job(tmp_path, os.fsdecode(b"caf\xe9.png"))
    assert ledger.admit(job, fp())
    assert job.key.endswith("/inbox/caf%E9.png")
    (row,) = ledger.waiting(1, ["inbox"], [])
    assert row.job == job and os.fsencode(row.job.origin.path).endswith(b"/caf\xe9.png")
    ledger.mark_failed(job.key, {**ERROR, "message": f"{job.origin.path} is not a PNG"})
    assert ledger.summary()["last_errors"][0]["message"] == f"{job.origin.path} is not a PNG"
    assert ledger.retry([os.fsdecode(os.fsencode(tmp_path / "inbox") + b"/caf\xe9.png")]) == 1


def test_threads_share_one_ledger(tmp_path: Path, ledger: Ledger) -> None:
    """The daemon calls from its event loop and from worker threads at once."""

    def work(t: int) -> None:
        for i in range(50):
            job = local_job(tmp_path, f"{t}-{i}.pdf")
            assert ledger.admit(job, fp())
            ledger.record_attempt(job.key, None)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = ledger.unfinished()
    assert len(rows) == 400 and {r.attempts for r in rows} == {1}


# --- crashes and other processes ------------------------------------------------------------------


def test_kill_9_mid_write_keeps_every_committed_row(tmp_path: Path, db: Path) -> None:
    """A writer killed at a random moment: the ledger opens clean and holds every row it reported
    committed.

    The child keeps writing until killed, so the kill always lands mid-run, most often inside a
    transaction.
    """
    rng = random.Random()
    committed: list[int] = []
    for round_ in range(3):
        child = spawn(
            f"""
            import itertools
            from pathlib import Path
            from ocrwatch.store.ledger import Fingerprint, Ledger
            from ocrwatch.sources.base import Job, LocalFile
            ledger = Ledger(Path({str(db)!r}))
            for i in itertools.count({round_ * 1_000_000}):
                origin = LocalFile(path=Path(f"/in/{{i}}.pdf"), inbox=Path("/in"))
                job = Job(origin=origin, source="s", detected_at=i)
                ledger.admit(job, Fingerprint(size=i, mtime_ns=i, sha256=f"{{i:064x}}"))
                ledger.set_state(job.key, "rendering", pages_total=i % 7)
                print(i, flush=True)
            """
        )
        with child:
            assert child.stdout is not None
            for _ in range(rng.randrange(1, 1000)):
                committed.append(int(child.stdout.readline()))
            child.send_signal(signal.SIGKILL)
        assert child.returncode == -signal.SIGKILL

        with closing(sqlite3.connect(db)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        with Ledger(db) as ledger:
            rows = {r.key: r for r in ledger.unfinished()}
        for i in committed:
            row = rows[f"file:///in/{i}.pdf"]
            assert row.job.detected_at == i and row.fingerprint == Fingerprint(
                size=i, mtime_ns=i, sha256=f"{i:064x}"
            )
            assert (row.state, row.pages_total) == ("rendering", i % 7)


def test_write_waits_for_a_lock_held_by_another_process(tmp_path: Path, db: Path) -> None:
    job = local_job(tmp_path, "a.pdf")
    with Ledger(db, lock_budget=10) as ledger:
        # `ocrwatch status` mid-read never blocks the daemon (WAL)
        with hold(db, "BEGIN", 5) as reader:
            start = time.monotonic()
            assert ledger.admit(job, fp())
            assert time.monotonic() - start < 2.5  # half the read: a blocked write waits it out
            reader.kill()

        with hold(db, "BEGIN EXCLUSIVE", 2) as writer:
            start = time.monotonic()
            ledger.set_state(job.key, "rendering")
            assert 1.0 < time.monotonic() - start < 8
        assert writer.returncode == 0
        row = ledger.known(job.key)
        assert row is not None and row.state == "rendering"


def test_lock_held_past_the_budget_is_a_transient_error(tmp_path: Path, db: Path) -> None:
    job = local_job(tmp_path, "a.pdf")
    with Ledger(db, lock_budget=0.5) as ledger:
        ledger.admit(job, fp())
        with hold(db, "BEGIN EXCLUSIVE", 30) as writer:
            try:
                start = time.monotonic()
                with pytest.raises(TransientError, match="stayed locked"):
                    ledger.set_state(job.key, "rendering")
                assert time.monotonic() - start < 5
            finally:
                writer.kill()
        ledger.set_state(job.key, "rendering")  # usable again once the other process is gone
        row = ledger.known(job.key)
        assert row is not None and row.state == "rendering"
