"""The ledger's schema: its migrations, in order, and the one spelling of "unfinished" its index
needs.

Kept apart from the queries (``ledger.py``), since a migration is appended once and never edited.
"""

from __future__ import annotations

import json
import sqlite3

from ocrwatch.store.database import Migration

# What an unfinished row is, written out: SQLite uses the partial index ``jobs_waiting`` only for a
# query whose WHERE holds this very term.
WAITING = "state IN ('queued', 'rendering', 'recognizing', 'writing')"


def ordering_columns(conn: sqlite3.Connection) -> None:
    """The job's source and priority as columns of their own (older rows kept them in their JSON
    only), and the unfinished rows indexed in the order they start, so waiting jobs stay in the
    ledger and the next ones are read from it as slots free (the index holds every column those
    reads and the count look at). Filled in batches: a large ledger is never read into memory at
    once."""
    conn.execute("ALTER TABLE jobs ADD COLUMN source TEXT")
    conn.execute("ALTER TABLE jobs ADD COLUMN priority INTEGER")
    batch = "SELECT key, job FROM jobs WHERE key > ? ORDER BY key LIMIT 1000"
    last = ""
    while rows := conn.execute(batch, (last,)).fetchall():
        jobs = [(key, json.loads(text)) for key, text in rows]
        fields = [(data["source"], data["priority"], key) for key, data in jobs]
        conn.executemany("UPDATE jobs SET source = ?, priority = ? WHERE key = ?", fields)
        last = rows[-1][0]
    conn.execute(
        "CREATE INDEX jobs_waiting ON jobs (priority DESC, created_at, source, key, state)"
        f" WHERE {WAITING}"
    )


# Each entry upgrades the schema from version i to i + 1; append, never edit, so old ledgers upgrade
# in place.
MIGRATIONS: tuple[Migration, ...] = (
    """
    CREATE TABLE jobs (
        key TEXT PRIMARY KEY,
        state TEXT NOT NULL
            CHECK (state IN ('queued', 'rendering', 'recognizing', 'writing', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        error_at REAL,
        job TEXT NOT NULL,
        fp_size INTEGER NOT NULL,
        fp_mtime_ns INTEGER,
        fp_sha256 TEXT,
        fp_etag TEXT,
        fp_version_id TEXT,
        pages_total INTEGER,
        pages_done INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL,
        next_attempt_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX jobs_by_state ON jobs (state, created_at);
    CREATE INDEX jobs_by_error ON jobs (error_at) WHERE error_at IS NOT NULL;
    """,
    # next_attempt_at was never used. The table is rebuilt because ALTER TABLE ... DROP COLUMN needs
    # SQLite 3.35.
    """
    CREATE TABLE jobs_new (
        key TEXT PRIMARY KEY,
        state TEXT NOT NULL
            CHECK (state IN ('queued', 'rendering', 'recognizing', 'writing', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        error_at REAL,
        job TEXT NOT NULL,
        fp_size INTEGER NOT NULL,
        fp_mtime_ns INTEGER,
        fp_sha256 TEXT,
        fp_etag TEXT,
        fp_version_id TEXT,
        pages_total INTEGER,
        pages_done INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL
    ) WITHOUT ROWID;
    INSERT INTO jobs_new SELECT key, state, attempts, last_error, error_at, job, fp_size,
        fp_mtime_ns, fp_sha256, fp_etag, fp_version_id, pages_total, pages_done, created_at,
        updated_at, finished_at FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_new RENAME TO jobs;
    CREATE INDEX jobs_by_state ON jobs (state, created_at);
    CREATE INDEX jobs_by_error ON jobs (error_at) WHERE error_at IS NOT NULL;
    """,
    # A local file's inode and ctime: a replacement may keep size and mtime, never these.
    """
    ALTER TABLE jobs ADD COLUMN fp_inode INTEGER;
    ALTER TABLE jobs ADD COLUMN fp_ctime_ns INTEGER;
    """,
    ordering_columns,
    # Finished jobs by content, so a copy of the same bytes finds the earlier result at once.
    """
    CREATE INDEX jobs_done_by_sha256 ON jobs (source, fp_sha256) WHERE state = 'done';
    CREATE INDEX jobs_done_by_etag ON jobs (source, fp_etag, fp_size) WHERE state = 'done';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
