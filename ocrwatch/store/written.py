"""What ocrwatch wrote, recorded where no user can write: the one ownership rule for outputs.

A mark inside a file (a JSON's ``schema``, a PDF's ``/OcrwatchSource``) can be copied by anyone, and
an output given to its source's owner can be edited by them, so neither may decide that a file is
ocrwatch's to replace, move or delete. The record can: one row per output file written (its folder
root and name below it, the inode, size and sha256 written, the document it was written for and the
uid of that document's source), in the ledger's file under ``state_dir``. A name holds ocrwatch's
own file for a document only when the file there is the one recorded, bit for bit, and was made from
a source of the same owner: Bob's new document never replaces or removes what was made from Alice's,
even at the same name.

Outputs written before this record existed carry no row: such a file is taken as ocrwatch's once,
where its own mark says so **and** it belongs to the daemon's user (which no other user can
arrange), and recorded when it is next written. The tables have their own schema version
(``written_schema``), beside the ledger's.

An S3 output carries its row itself, in its metadata (``object_record``): the URI of the source
object it was made from (bucket and key) and the MD5 of the bytes written, which the object's ETag
(or, where the server's ETag is no MD5, the bytes read again) must match. Every daemon that consumes
a bucket's events shares its objects, while a ledger is one host's, so the row travels with the
object; whoever can forge it can write that key, and so replace the object without ocrwatch. One
rule (``rule``) judges both: ``judge`` for a file, ``judge_object`` for an object.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from ocrwatch.safefs import Folder, describe, hash_fd
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


class Verdict(str):
    """Why a name is not ocrwatch's to replace for a document; empty (falsy) where it is."""


OURS = Verdict("")


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


def vouched(records: list[Output], info: os.stat_result, digest: str, owner: int | None) -> bool:
    """Whether the record holds the file of ``info`` whose content hashed to ``digest`` as
    ocrwatch's output, unchanged since written, for a document of ``owner``'s: what ``judge`` asks,
    for bytes already read."""
    wanted = (info.st_ino, info.st_size, digest, owner)
    return owner is not None and any(
        (r.inode, r.size, r.sha256, r.owner) == wanted for r in records
    )


def judge(
    records: list[Output],
    folder: Folder,
    name: str,
    owner: int | None,
    marked: bool,
    *,
    verify: bool = True,
) -> Verdict:
    """Whether the file at ``name`` in ``folder`` is ocrwatch's to replace or remove for a document
    whose source belongs to ``owner`` (None: unknown, so nothing is). ``records``: what the record
    says was written there; ``marked``: the file carries ocrwatch's own mark, which counts only
    where no row exists and the file belongs to the daemon's user (an output of an ocrwatch older
    than the record). ``verify``: compare the content's sha256 too (before anything is replaced or
    removed), not only the inode and size."""
    fd = folder.open_read(name)
    if fd is None:
        info = folder.lstat(name)
        return OURS if info is None else Verdict(describe(info.st_mode))
    try:
        info = os.fstat(fd)
        older = marked and info.st_uid == os.geteuid()
        same = [r for r in records if (r.inode, r.size) == (info.st_ino, info.st_size)]
        if verify and same:
            digest = hash_fd(fd)
            same = [r for r in same if r.sha256 == digest]
    finally:
        os.close(fd)
    return rule(bool(records), [r.owner for r in same], owner, older, "a file")


def rule(
    recorded: bool, owners: Sequence[int | str], owner: int | str | None, older: bool, what: str
) -> Verdict:
    """The one ownership rule, for a file and an S3 object alike, once something lies at the name:
    ``recorded``, whether the record holds an output there at all; ``owners``, the owners of those
    it holds with the very content found; ``owner``, whose document this is (a local source's uid,
    an S3 source's ``object_owner``; None: unknown, so nothing is ours); ``older``, it carries
    ocrwatch's mark and what no user can arrange says an ocrwatch older than the record wrote it."""
    if not recorded:
        return OURS if older and owner is not None else Verdict(f"{what} ocrwatch did not write")
    if not owners:
        return Verdict(f"{what} ocrwatch did not write, or one changed since ocrwatch wrote it")
    if owner is None or owner not in owners:
        theirs = "a document of another user" if isinstance(owners[0], int) else owners[0]
        return Verdict(f"ocrwatch's output for {theirs}")
    return OURS


# --- S3 objects: the row in the object's own metadata ---------------------------------------------

OWNER_KEY, MD5_KEY = "ocrwatch-source", "ocrwatch-md5"
"""The metadata of an output object that record it: its source's ``object_owner`` (percent-encoded)
and the MD5 of the bytes written."""
OLDER_KEY = "ocrwatch-source-etag"
"""Metadata every ocrwatch has put on its outputs (the source's ETag); a user's upload has none."""
MAX_OWNER = 1024
"""The longest source URI kept as it is in an object's metadata (S3 allows 2 KB of it in all); a
longer one is kept as its sha256."""


@dataclass(frozen=True)
class Stored:
    """An S3 object as a read of it found it: its ETag (without quotes) and user metadata."""

    etag: str
    metadata: Mapping[str, str]


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


def judge_object(
    stored: Stored | None,
    owner: str | None,
    marked: Callable[[], bool],
    md5: Callable[[], str | None],
) -> Verdict:
    """``judge`` for the S3 object ``stored`` (None: no object there), for a document whose source
    is ``owner`` (``object_owner``). The object is the one its record names where its ETag is the
    MD5 recorded, or (a server whose ETag is no MD5: SSE-KMS, a multipart upload) ``md5()``, of its
    bytes read again, is. ``marked``: it carries ocrwatch's mark, which counts only where it carries
    no record but the metadata an older ocrwatch put on its outputs."""
    if stored is None:
        return OURS
    meta = stored.metadata
    recorded = OWNER_KEY in meta and MD5_KEY in meta
    owners: list[int | str] = []
    if recorded and (meta[MD5_KEY] == stored.etag or meta[MD5_KEY] == md5()):
        owners.append(unquote(meta[OWNER_KEY]))
    older = not recorded and OLDER_KEY in meta and marked()
    return rule(recorded, owners, owner, older, "an object")
