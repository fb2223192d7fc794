"""What ocrwatch wrote, recorded where no user can write: the record the ownership rule of outputs
(``sinks.ownership``) reads.

One row per output file written (its folder root and name below it, the inode, size and sha256
written, the document it was written for and the uid of that document's source), in the ledger's
file under ``state_dir``. Outputs written before this record existed carry no row (the rule then
asks their mark), and are recorded when next written. The tables have their own schema version
(``written_schema``), beside the ledger's.

An S3 output carries its row itself, in its metadata (``object_record``): the URI of the source
object it was made from (bucket and key) and the MD5 of the bytes written. Every daemon that
consumes a bucket's events shares its objects, while a ledger is one host's, so the row travels
with the object; whoever can forge it can write that key, and so replace the object without
ocrwatch.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ocrwatch.store.database import StateUnusable, migrate_versioned
from ocrwatch.store.ledger import Ledger

_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE written (
        root BLOB NOT NULL,
        name BLOB NOT NULL,
        job TEXT NOT NULL,
        owner INTEGER NOT NULL,
        inode INTEGER NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        written_at REAL NOT NULL,
        PRIMARY KEY (root, name, inode)
    ) WITHOUT ROWID;
    CREATE INDEX written_by_job ON written (job);
    """,
)


@dataclass(frozen=True)
class Output:
    """One output file as written: where (a root and the name below it), for which document, and
    what."""

    root: Path
    name: str  # relative to ``root``, "/"-separated
    job: str
    owner: int  # the uid of the source it was made from
    inode: int
    size: int
    sha256: str


def _key(root: Path, name: str) -> tuple[bytes, bytes]:
    return os.fsencode(root), os.fsencode(name)


class Written:
    """The record of outputs, in ``ledger``'s file: blocking, thread-safe, each call one
    transaction."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        try:
            ledger.transact(self._migrate, write=True)
        except sqlite3.DatabaseError as exc:
            raise StateUnusable(
                f"the ledger {ledger.path} cannot hold the record of outputs: {exc}"
            ) from None

    def _migrate(self, conn: sqlite3.Connection) -> None:
        what = "record of outputs schema"
        migrate_versioned(conn, "written_schema", _MIGRATIONS, path=self._ledger.path, what=what)

    def get(self, root: Path, name: str) -> list[Output]:
        """The files recorded at ``name``: one, or two while a write is between its record and its
        rename."""

        def tx(conn: sqlite3.Connection) -> list[Output]:
            rows = conn.execute(
                "SELECT job, owner, inode, size, sha256 FROM written WHERE root = ? AND name = ?",
                _key(root, name),
            ).fetchall()
            return [Output(root, name, *row) for row in rows]

        return self._ledger.transact(tx)

    def put(self, output: Output) -> None:
        """Record a file about to be renamed over its name, beside what the name holds now, so that
        whatever a crash leaves there is recorded; ``drop_others`` drops the other rows once the
        rename is done."""
        row = (*_key(output.root, output.name), output.job, output.owner, output.inode, output.size)

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO written (root, name, job, owner, inode, size, sha256, "
                "written_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, output.sha256, time.time()),
            )

        self._ledger.transact(tx, write=True)

    def drop_others(self, output: Output) -> None:
        """``output`` now holds its name: the rows of files it replaced go."""

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM written WHERE root = ? AND name = ? AND inode != ?",
                (*_key(output.root, output.name), output.inode),
            )

        self._ledger.transact(tx, write=True)

    def forget(self, root: Path, name: str) -> None:
        """Nothing ocrwatch wrote is at ``name`` any more (it removed it)."""

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM written WHERE root = ? AND name = ?", _key(root, name))

        self._ledger.transact(tx, write=True)

    def move(self, output: Output, root: Path, name: str, inode: int) -> None:
        """The recorded ``output`` is now at ``root``/``name`` as ``inode`` (the archive moved or
        copied it)."""

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM written WHERE root = ? AND name = ?", _key(root, name))
            conn.execute(
                "UPDATE written SET root = ?, name = ?, inode = ? WHERE root = ? AND name = ? AND "
                "inode = ?",
                (*_key(root, name), inode, *_key(output.root, output.name), output.inode),
            )

        self._ledger.transact(tx, write=True)

    def of_job(self, job: str) -> list[Output]:
        """Every output recorded for the document ``job``, in the order written."""

        def tx(conn: sqlite3.Connection) -> list[Output]:
            rows = conn.execute(
                "SELECT root, name, owner, inode, size, sha256 FROM written WHERE job = ? ORDER BY "
                "written_at",
                (job,),
            ).fetchall()
            return [
                Output(Path(os.fsdecode(r[0])), os.fsdecode(r[1]), job, r[2], r[3], r[4], r[5])
                for r in rows
            ]

        return self._ledger.transact(tx)


# --- S3 objects: the row in the object's own metadata ---------------------------------------------

OWNER_KEY, MD5_KEY = "ocrwatch-source", "ocrwatch-md5"
"""The metadata of an output object that record it: its source's ``object_owner`` (percent-encoded)
and the MD5 of the bytes written."""
OLDER_KEY = "ocrwatch-source-etag"
"""Metadata every ocrwatch has put on its outputs (the source's ETag); a user's upload has none."""
MAX_OWNER = 1024
"""The longest source URI kept as it is in an object's metadata (S3 allows 2 KB of it in all); a
longer one is kept as its sha256."""


def object_owner(uri: str) -> str:
    """Whose an output object is: the URI of the source object it was made from (bucket and key,
    not the version: a new version replaces its outputs), or its sha256 where it is too long."""
    if len(quote(uri, safe="/:")) <= MAX_OWNER:
        return uri
    return "sha256:" + hashlib.sha256(uri.encode("utf-8", "surrogatepass")).hexdigest()


def object_record(owner: str, md5: str) -> dict[str, str]:
    """The metadata that records an object ocrwatch writes for ``owner``'s document, whose bytes
    have the MD5 ``md5``."""
    return {OWNER_KEY: quote(owner, safe="/:"), MD5_KEY: md5}
