"""Real ledger files for the start-up tests, and the ways a user's disk or hands break them.

``make_ledger`` writes a ledger through ``Ledger`` (the real schema) and fills it in one
transaction, so it spans many pages; the breakers then damage the file as a crash, a bad disk, a
copy cut short or a newer ocrwatch would.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import time
from contextlib import closing
from pathlib import Path

import pytest

from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.store import ledger as ledger_module
from ocrwatch.store.ledger import Ledger

ROWS = 2000


def make_ledger(path: Path, inbox: Path, rows: int = ROWS) -> list[Job]:
    """A closed ledger with ``rows`` done jobs (no ``-wal`` left, so the main file holds
    everything)."""
    Ledger(path).close()
    now = time.time()
    jobs = [
        Job(origin=LocalFile(path=inbox / f"doc {i:05d}.pdf", inbox=inbox), source="local")
        for i in range(rows)
    ]
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany(
            "INSERT INTO jobs (key, state, attempts, job, fp_size, fp_mtime_ns, fp_sha256, "
            "created_at, updated_at,"
            " finished_at) VALUES (?, 'done', 1, ?, ?, ?, ?, ?, ?, ?)",
            [
                (job.key, ledger_module._dump_job(job), i, i, f"{i:064x}", now, now, now)
                for i, job in enumerate(jobs)
            ],
        )
    assert not path.with_name(path.name + "-wal").exists()
    return jobs


def write_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(64 * 1024))


def truncate_half(path: Path) -> None:
    """A copy cut short: the first half of the pages only."""
    os.truncate(path, path.stat().st_size // 2 // 4096 * 4096)


def set_newer_schema(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {ledger_module.SCHEMA_VERSION + 1}")


def hide_rows_in_the_middle(path: Path, hidden: int = 4) -> int:
    """Damage one leaf page of the jobs table in the middle of the file so that every query still
    succeeds but ``hidden`` rows vanish from it: the page's cell count is lowered, its cells stay.
    -> the page number"""
    with closing(sqlite3.connect(path)) as conn:
        try:
            leaves = [
                r[0]
                for r in conn.execute(
                    "SELECT pageno FROM dbstat WHERE name = 'jobs' AND pagetype = 'leaf'"
                )
            ]
        except sqlite3.OperationalError:
            pytest.skip("this SQLite lacks the dbstat table")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    page = sorted(leaves)[len(leaves) // 2]
    with open(path, "r+b") as f:
        # b-tree page header: type (1), first freeblock (2), cell count (2)
        f.seek((page - 1) * page_size + 3)
        (cells,) = struct.unpack(">H", f.read(2))
        assert cells > hidden
        f.seek((page - 1) * page_size + 3)
        f.write(struct.pack(">H", cells - hidden))
    return page


BREAKERS = {
    "garbage": write_garbage,
    "truncated": truncate_half,
    "damaged in the middle": hide_rows_in_the_middle,
    "newer schema": set_newer_schema,
}
