"""The ledger: one SQLite row per job, so work survives restarts and a changed file is processed
again.

One file (``state_dir/ledger.sqlite3``, a ``database.Database``: private, WAL, checked whole at
open): methods are blocking and thread-safe, so the daemon may call them from its event loop and
from worker threads, and each is one transaction. Jobs that wait for a document slot wait here, not
in memory: ``waiting`` reads the next ones in the order they start (higher priority first, then the
oldest), through an index of the unfinished rows.

Every byte string a file system allows as a name round-trips: a key is a ``file://`` URI, whose path
is percent-encoded from the name's bytes, and a job's JSON keeps a name that is not UTF-8 as
``\\udcXX`` escapes (Python's surrogateescape), which ``json`` reads back to the same name.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ocrwatch.errors import path_fault
from ocrwatch.safefs import Signature, sha256_file
from ocrwatch.sources.base import Job, LocalFile, Origin, S3Object
from ocrwatch.store.database import Database, StateUnusable, make_private_dirs, migrate
from ocrwatch.store.ledger_schema import MIGRATIONS, SCHEMA_VERSION, WAITING

__all__ = [
    "Fingerprint",
    "JobRow",
    "Ledger",
    "StateUnusable",
    "make_private_dirs",
    "same_content",
    "sha256_file",
]

State = Literal["queued", "rendering", "recognizing", "writing", "done", "failed"]
STATES: tuple[State, ...] = ("queued", "rendering", "recognizing", "writing", "done", "failed")
UNFINISHED: tuple[State, ...] = ("queued", "rendering", "recognizing", "writing")
QUEUED: tuple[State, ...] = ("queued",)
"""The jobs of a running daemon that wait (``ocrwatch status``): past ``queued`` a job runs."""


_SETTABLE = frozenset({"pages_total", "pages_done"})


@dataclass(frozen=True)
class Fingerprint:
    """What identifies a source's content: stat fields are cheap, sha256 (or S3's ETag) is
    authoritative. ``inode`` and ``ctime_ns`` (local files) only tell whether the stat fields may be
    trusted to skip hashing."""

    size: int
    mtime_ns: int | None
    sha256: str | None
    etag: str | None = None
    version_id: str | None = None
    inode: int | None = None
    ctime_ns: int | None = None

    def stat(self, device: int) -> Signature | None:
        """The recorded stat fields as the signature of a file on ``device`` (a key names one
        inbox's file, so its device is not kept); None where they were not recorded (S3, an older
        row)."""
        if self.mtime_ns is None or self.inode is None or self.ctime_ns is None:
            return None
        return Signature(self.size, self.mtime_ns, self.ctime_ns, self.inode, device)


@dataclass(frozen=True)
class JobRow:
    key: str
    job: Job
    state: State
    attempts: int
    last_error: dict[str, Any] | None
    fingerprint: Fingerprint
    pages_total: int | None
    pages_done: int
    created_at: float
    updated_at: float
    finished_at: float | None


def same_content(a: Fingerprint, b: Fingerprint) -> bool:
    """Whether two fingerprints name the same bytes, judged by the strongest evidence both carry.

    A different size always means different content; then sha256 decides, else ETag with version,
    else the stat fields: mtime, and the inode and ctime where both carry them (a local file over
    its byte budget is never hashed, and a replacement keeping its size and mtime is still new).
    When neither can tell, the answer is no, so the caller hashes or processes again.
    """
    if a.size != b.size:
        return False
    if a.sha256 and b.sha256:
        return a.sha256 == b.sha256
    if a.etag and b.etag:
        return a.etag == b.etag and a.version_id == b.version_id
    if a.mtime_ns is None or a.mtime_ns != b.mtime_ns:
        return False
    pairs = ((a.inode, b.inode), (a.ctime_ns, b.ctime_ns))
    return all(mine is None or theirs is None or mine == theirs for mine, theirs in pairs)


class Ledger(Database):
    """Every job the daemon has seen, its state and its source fingerprint."""

    def __init__(self, path: Path, *, lock_budget: float = 30.0) -> None:
        super().__init__(path, self._migrate, lock_budget=lock_budget)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def admit(self, job: Job, fp: Fingerprint) -> bool:
        """Record a job the source found; True when it must be started.

        A new key, or a known key whose content changed (whatever its state), is queued afresh with
        its attempts reset. A job still ``queued`` with the same content is True as well, so a job
        put back by ``ocrwatch retry`` starts when a scan sees it again (the caller ignores jobs it
        is already running), and so is a job that failed only for what its path was at the time
        (``source_gone``, ``not_a_regular_file``, ``source_changed``: vanished, a link, rewritten
        throughout) and is seen again as a settled regular file. Otherwise (done, failed or
        mid-stage with the same content) the answer is False. A stat change with identical content
        refreshes the stored fingerprint, so the next cheap ``known()`` + ``same_content()`` check
        hits without hashing.
        """

        def tx(conn: sqlite3.Connection) -> bool:
            now = time.time()
            row = conn.execute("SELECT * FROM jobs WHERE key = ?", (job.key,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO jobs (key, state, job, source, priority, fp_size, fp_mtime_ns, "
                    "fp_sha256, fp_etag, fp_version_id, fp_inode, fp_ctime_ns, created_at, "
                    "updated_at) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job.key, *_job_columns(job), *_fp_columns(fp), now, now),
                )
                return True
            old = _fingerprint(row)
            if not same_content(old, fp):
                conn.execute(
                    "UPDATE jobs SET state = 'queued', attempts = 0, last_error = NULL,"
                    " error_at = NULL, job = ?, source = ?, priority = ?, fp_size = ?,"
                    " fp_mtime_ns = ?, fp_sha256 = ?, fp_etag = ?, fp_version_id = ?, fp_inode = ?,"
                    " fp_ctime_ns = ?, pages_total = NULL, pages_done = 0, created_at = ?,"
                    " updated_at = ?, finished_at = NULL WHERE key = ?",
                    (*_job_columns(job), *_fp_columns(fp), now, now, job.key),
                )
                return True
            merged = Fingerprint(
                size=fp.size,
                mtime_ns=fp.mtime_ns if fp.mtime_ns is not None else old.mtime_ns,
                sha256=fp.sha256 or old.sha256,
                etag=fp.etag or old.etag,
                version_id=fp.version_id or old.version_id,
                inode=fp.inode if fp.inode is not None else old.inode,
                ctime_ns=fp.ctime_ns if fp.ctime_ns is not None else old.ctime_ns,
            )
            if merged != old:
                conn.execute(
                    "UPDATE jobs SET fp_size = ?, fp_mtime_ns = ?, fp_sha256 = ?, fp_etag = ?, "
                    "fp_version_id = ?,"
                    " fp_inode = ?, fp_ctime_ns = ? WHERE key = ?",
                    (*_fp_columns(merged), job.key),
                )
            if row["state"] == "failed" and path_fault(_error_kind(row["last_error"])):
                conn.execute(
                    "UPDATE jobs SET state = 'queued', attempts = 0, finished_at = NULL, "
                    "updated_at = ? WHERE key = ?",
                    (now, job.key),
                )
            elif row["state"] != "queued":
                return False
            # The job waits here until a slot frees: what the source handed over last is what
            # runs (an SQS message delivered again carries a new receipt, and only that one
            # acknowledges it).
            conn.execute(
                "UPDATE jobs SET job = ?, source = ?, priority = ? WHERE key = ?",
                (*_job_columns(job), job.key),
            )
            return True

        return self.transact(tx, write=True)

    def known(self, key: str) -> JobRow | None:
        return self.transact(
            lambda conn: _maybe_row(conn.execute("SELECT * FROM jobs WHERE key = ?", (key,)))
        )

    def twins(self, job: Job, sha256: str, limit: int = 8) -> list[Job]:
        """The jobs of the same source most recently done with the content ``job`` has (a local
        file's sha256; an S3 object's ETag and size, which its row keeps instead), newest first:
        earlier results this one may take (``reuse``)."""
        origin = job.origin
        if isinstance(origin, S3Object):
            if not origin.etag:
                return []
            column = "fp_etag = ? AND fp_size = ?"
            values: tuple[str | int, ...] = (origin.etag, origin.size or 0)
        else:
            column, values = "fp_sha256 = ?", (sha256,)
        sql = (
            f"SELECT job FROM jobs WHERE state = 'done' AND source = ? AND {column} AND key != ?"
            " ORDER BY finished_at DESC LIMIT ?"
        )
        found = self.transact(
            lambda conn: conn.execute(sql, (job.source, *values, job.key, limit)).fetchall()
        )
        return [_load_job(row[0]) for row in found]

    def set_state(self, key: str, state: State, **fields: Any) -> None:
        """Move a job to another stage; ``fields`` may set pages_total and pages_done."""
        if state not in STATES:
            raise ValueError(f"unknown ledger state {state!r}")
        if unknown := set(fields) - _SETTABLE:
            raise TypeError(f"set_state cannot set {sorted(unknown)}")
        assignments = "".join(f", {name} = ?" for name in fields)
        finished = time.time() if state in ("done", "failed") else None
        self._update(
            key, f"state = ?, finished_at = ?{assignments}", (state, finished, *fields.values())
        )

    def record_attempt(self, key: str, error: dict[str, Any] | None) -> int:
        """Count one attempt and return the total; ``error`` (when given) becomes the job's last
        error.

        Counting when an attempt starts (``error=None``) makes a document that kills the process
        count too, so a crash loop still ends in ``failed``.
        """

        def tx(conn: sqlite3.Connection) -> int:
            now = time.time()
            params: tuple[str | float, ...] = ()
            if error is None:
                sql = "attempts = attempts + 1"
            else:
                sql, params = (
                    "attempts = attempts + 1, last_error = ?, error_at = ?",
                    (json.dumps(error), now),
                )
            if (
                conn.execute(
                    f"UPDATE jobs SET {sql}, updated_at = ? WHERE key = ?", (*params, now, key)
                ).rowcount
                == 0
            ):
                raise KeyError(key)
            return int(
                conn.execute("SELECT attempts FROM jobs WHERE key = ?", (key,)).fetchone()[0]
            )

        return self.transact(tx, write=True)

    def release_attempt(self, key: str) -> None:
        """Give back the attempt counted at the start of a run that a clean shutdown interrupted:
        only an unclean end (``kill -9``, power loss) counts toward the crash-loop bound. The row
        stays unfinished."""
        self._update(key, "attempts = max(attempts - 1, 0)", ())

    def park(self, key: str, error: dict[str, Any]) -> int:
        """A fault of the place (disk full, folder unwritable) ended the run: its attempt given back
        as by ``release_attempt`` (the document is not at fault), the job queued again with
        ``error`` as its last error, so ``ocrwatch status`` shows what it waits for; returns the
        attempts."""

        def tx(conn: sqlite3.Connection) -> int:
            now = time.time()
            cur = conn.execute(
                "UPDATE jobs SET state = 'queued', attempts = max(attempts - 1, 0), last_error = "
                "?, error_at = ?,"
                " updated_at = ? WHERE key = ?",
                (json.dumps(error), now, now, key),
            )
            if cur.rowcount == 0:
                raise KeyError(key)
            return int(
                conn.execute("SELECT attempts FROM jobs WHERE key = ?", (key,)).fetchone()[0]
            )

        return self.transact(tx, write=True)

    def mark_done(self, key: str) -> None:
        self.set_state(key, "done")

    def mark_failed(self, key: str, error: dict[str, Any]) -> None:
        now = time.time()
        self._update(
            key,
            "state = 'failed', last_error = ?, error_at = ?, finished_at = ?",
            (json.dumps(error), now, now),
        )

    def unfinished(self, states: Collection[State] = UNFINISHED) -> list[JobRow]:
        """Unfinished jobs (queued or interrupted mid-stage; ``states``: only those), oldest
        first."""
        marks = ", ".join("?" * len(states))
        sql = f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at, key"
        return self.transact(lambda conn: [_job_row(r) for r in conn.execute(sql, tuple(states))])

    def waiting(
        self, limit: int, sources: Collection[str], running: Collection[str]
    ) -> list[JobRow]:
        """The next ``limit`` unfinished jobs of ``sources`` to start, leaving out the keys
        ``running``: higher priority first, then the oldest. Read through the index of unfinished
        rows in that order, so the cost is the rows passed over (``running``), not the backlog's
        length."""
        where, params = _waiting_where(sources, running)
        return self.transact(
            lambda conn: [
                _job_row(r)
                for r in conn.execute(
                    f"SELECT * FROM jobs INDEXED BY jobs_waiting WHERE {where}"
                    " ORDER BY priority DESC, created_at, source, key LIMIT ?",
                    (*params, limit),
                )
            ]
        )

    def waiting_by(
        self, sources: Collection[str], running: Collection[str], place: Callable[[Job], str]
    ) -> Counter[str]:
        """The unfinished jobs of ``sources`` but ``running``, counted by ``place(job)`` (``ocrwatch
        status``'s queue by inbox): read one row at a time, so a long backlog costs time here, not
        memory."""
        where, params = _waiting_where(sources, running)
        sql = f"SELECT job FROM jobs INDEXED BY jobs_waiting WHERE {where}"
        return self.transact(
            lambda conn: Counter(place(_load_job(text)) for (text,) in conn.execute(sql, params))
        )

    def backlog(
        self, sources: Collection[str], running: Collection[str]
    ) -> tuple[int, float | None]:
        """How many unfinished jobs of ``sources`` wait, leaving out the keys ``running``, and when
        the oldest of them was admitted (None: none waits). Counted on the index alone."""
        where, params = _waiting_where(sources, running)
        sql = f"SELECT count(*), min(created_at) FROM jobs INDEXED BY jobs_waiting WHERE {where}"
        row = self.transact(lambda conn: conn.execute(sql, params).fetchone())
        return int(row[0]), row[1]

    def retry(self, selectors: list[str] | None = None) -> int:
        """Put failed jobs back in the queue with attempts reset; returns how many.

        A selector is a key (URI) or a local path, and matches the job it names or every job below
        it.
        """
        wanted = None if not selectors else [_selector_uri(s) for s in selectors]

        def tx(conn: sqlite3.Connection) -> int:
            keys = [r["key"] for r in conn.execute("SELECT key FROM jobs WHERE state = 'failed'")]
            now = time.time()
            chosen = [
                (now, k) for k in keys if wanted is None or any(_matches(k, w) for w in wanted)
            ]
            conn.executemany(
                "UPDATE jobs SET state = 'queued', attempts = 0, finished_at = NULL, updated_at = "
                "? WHERE key = ?",
                chosen,
            )
            return len(chosen)

        return self.transact(tx, write=True)

    def summary(self, errors: int = 10, waiting: Collection[State] = UNFINISHED) -> dict[str, Any]:
        """What ``ocrwatch status`` shows: counts by state, the oldest job in a ``waiting`` state,
        the latest errors. With no daemon every unfinished job waits for the next start; a running
        daemon's jobs past ``queued`` are running, not waiting."""

        def tx(conn: sqlite3.Connection) -> dict[str, Any]:
            now = time.time()
            counts = dict.fromkeys(STATES, 0)
            counts.update(
                conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
            )
            marks = ", ".join("?" * len(waiting))
            oldest = conn.execute(
                f"SELECT key, created_at FROM jobs WHERE state IN ({marks}) ORDER BY created_at "
                "LIMIT 1",
                tuple(waiting),
            ).fetchone()
            latest = conn.execute(
                "SELECT key, state, last_error, error_at FROM jobs WHERE error_at IS NOT NULL"
                " ORDER BY error_at DESC LIMIT ?",
                (errors,),
            ).fetchall()
            return {
                "counts": counts,
                "oldest_waiting": None
                if oldest is None
                else {"key": oldest[0], "age": now - oldest[1]},
                "last_errors": [
                    {
                        "key": r["key"],
                        "state": r["state"],
                        "kind": (e := json.loads(r["last_error"])).get("kind"),
                        "message": e.get("message"),
                        "at": r["error_at"],
                    }
                    for r in latest
                ],
            }

        return self.transact(tx)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        migrate(conn, MIGRATIONS, version, path=self.path, what="schema")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _update(self, key: str, assignments: str, params: Iterable[Any]) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                f"UPDATE jobs SET {assignments}, updated_at = ? WHERE key = ?",
                (*params, time.time(), key),
            )
            if cur.rowcount == 0:
                raise KeyError(key)

        self.transact(tx, write=True)


def _error_kind(last_error: str | None) -> str | None:
    try:
        error = json.loads(last_error) if last_error else None
    except ValueError:
        return None
    return error.get("kind") if isinstance(error, dict) else None


def _waiting_where(
    sources: Collection[str], running: Collection[str]
) -> tuple[str, tuple[str, ...]]:
    """The unfinished rows of ``sources`` but ``running``. ``+source``: a filter on the index's
    entries, not a constraint SQLite would look up one value at a time (and then sort what it
    found)."""
    where = f"{WAITING} AND +source IN ({', '.join('?' * len(sources))})"
    if running:
        where += f" AND key NOT IN ({', '.join('?' * len(running))})"
    return where, (*sources, *running)


def _job_columns(job: Job) -> tuple[Any, ...]:
    return (_dump_job(job), job.source, job.priority)


def _fp_columns(fp: Fingerprint) -> tuple[Any, ...]:
    return (fp.size, fp.mtime_ns, fp.sha256, fp.etag, fp.version_id, fp.inode, fp.ctime_ns)


def _fingerprint(row: sqlite3.Row) -> Fingerprint:
    return Fingerprint(
        size=row["fp_size"],
        mtime_ns=row["fp_mtime_ns"],
        sha256=row["fp_sha256"],
        etag=row["fp_etag"],
        version_id=row["fp_version_id"],
        inode=row["fp_inode"],
        ctime_ns=row["fp_ctime_ns"],
    )


def _maybe_row(cur: sqlite3.Cursor) -> JobRow | None:
    row = cur.fetchone()
    return None if row is None else _job_row(row)


def _job_row(row: sqlite3.Row) -> JobRow:
    return JobRow(
        key=row["key"],
        job=_load_job(row["job"]),
        state=row["state"],
        attempts=row["attempts"],
        last_error=None if row["last_error"] is None else json.loads(row["last_error"]),
        fingerprint=_fingerprint(row),
        pages_total=row["pages_total"],
        pages_done=row["pages_done"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _dump_job(job: Job) -> str:
    """The job as JSON, with its origin tagged by type, so a resumed job is rebuilt exactly."""
    origin: dict[str, Any]
    if isinstance(job.origin, LocalFile):
        origin = {"type": "local", "path": str(job.origin.path), "inbox": str(job.origin.inbox)}
    else:
        o = job.origin
        origin = {
            "type": "s3",
            "bucket": o.bucket,
            "key": o.key,
            "etag": o.etag,
            "version_id": o.version_id,
            "size": o.size,
        }
    return json.dumps(
        {
            "origin": origin,
            "source": job.source,
            "priority": job.priority,
            "prompt": job.prompt,
            "max_bytes": job.max_bytes,
            "max_pages": job.max_pages,
            "detected_at": job.detected_at,
            "receipt": job.receipt,
            "duplicates": job.duplicates,
        }
    )


def _load_job(text: str) -> Job:
    data = json.loads(text)
    fields = data.pop("origin")
    origin: Origin
    if fields.pop("type") == "local":
        origin = LocalFile(path=Path(fields["path"]), inbox=Path(fields["inbox"]))
    else:
        origin = S3Object(**fields)
    return Job(origin=origin, **data)


def _selector_uri(selector: str) -> str:
    """A URI selector as given; a local path made absolute and resolved the way ``LocalFile.uri``
    is."""
    if "://" in selector:
        return selector
    return Path(os.path.expanduser(selector)).resolve().as_uri()


def _matches(key: str, selector: str) -> bool:
    """The selector is the key itself, the same S3 object at some version, or a folder or prefix
    above it."""
    base = selector.rstrip("/")
    return key == selector or key.startswith(f"{selector}?versionId=") or key.startswith(f"{base}/")
