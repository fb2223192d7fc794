"""The ledger's SQLite file as a file: private on disk, opened in WAL mode, checked whole, migrated,
and one transaction helper retried while another process holds the lock.

The file names every document seen and, with hooks, each pending result's JSON, and whoever can
replace it can make the daemon skip or redo documents. So it lives in a ``state_dir`` that only the
daemon's user owns and no one else may write (checked before anything is made there: a start is
refused otherwise, exit 2), created 0700 with its missing parents, and the file itself is created
0600; SQLite gives its ``-wal`` and ``-shm`` files the main file's mode. ``ledger``, ``deliveries``
and ``written`` each keep their tables in it, through one ``Database``: one connection, one lock,
one way to run a transaction.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import structlog
import tenacity

from ocrwatch.config.roots import state_fault
from ocrwatch.errors import (
    SQLITE_BUSY,
    SQLITE_CORRUPT,
    SQLITE_FULL,
    SQLITE_LOCKED,
    SQLITE_NOTADB,
    ConfigError,
    DiskFull,
    OcrwatchError,
    TransientError,
    sqlite_code,
)

T = TypeVar("T")
log = structlog.get_logger()

Migration = str | Callable[[sqlite3.Connection], None]
"""One schema step: SQL statements separated by ``;``, or a function, for a step SQL alone cannot
take."""


class StateUnusable(ConfigError):
    """The ledger or its folder cannot be used as it is: restarting cannot help, the user must act
    (exit 2)."""

    kind = "state_unusable"


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700, then refuse it (``StateUnusable``)
    unless it is private: the ledger in it names every document seen, and whoever may write there
    may replace it."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
    require_private_dir(path)


def require_private_dir(path: Path) -> None:
    """``StateUnusable`` unless ``path`` is a folder owned by this process's user that neither its
    group nor anyone else may write; the message names the folder, the hint the command that makes
    it so."""
    fault = private_dir_fault(path)
    if fault is not None:
        raise StateUnusable(f"state_dir: {path} {fault[0]}", hint=fault[1])


def private_dir_fault(path: Path) -> tuple[str, str] | None:
    """What makes the existing folder ``path`` unfit to hold the ledger, and what to do about it;
    None: nothing. The rule is every root's (``roots``): not a link, this user's, no one else's to
    write."""
    return state_fault(path)


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``open``'s opener for a file of ``state_dir``: created 0600, never through a link, and an
    existing one that a version before this one left readable by others made private."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _tighten(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (SQLite takes an empty file for a new
    database); SQLite gives its ``-wal`` and ``-shm`` the main file's mode, and those an older
    version left are made private too."""
    os.close(open_private(path, os.O_RDONLY | os.O_CREAT))
    for suffix in ("-wal", "-shm"):
        try:
            os.close(open_private(path.with_name(path.name + suffix), os.O_RDONLY))
        except FileNotFoundError:
            continue


def _tighten(fd: int) -> None:
    info = os.fstat(fd)
    if info.st_mode & 0o077 and info.st_uid == os.geteuid():
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o700)


def migrate(
    conn: sqlite3.Connection, steps: Sequence[Migration], version: int, *, path: Path, what: str
) -> None:
    """Run ``steps[version:]``: each upgrades a set of tables from its index to the next version. A
    version newer than this ocrwatch knows is refused rather than written over."""
    if version > len(steps):
        raise StateUnusable(
            f"the ledger {path} has {what} version {version}, newer than this ocrwatch"
            f" ({len(steps)})",
            hint="upgrade ocrwatch, or point state_dir at another folder",
        )
    for step in steps[version:]:
        if isinstance(step, str):
            for statement in filter(str.strip, step.split(";")):
                conn.execute(statement)
        else:
            step(conn)


def migrate_versioned(
    conn: sqlite3.Connection, table: str, steps: Sequence[Migration], *, path: Path, what: str
) -> None:
    """``migrate`` for a set of tables that keeps its version in a one-row table of its own
    (``table``), beside the ledger's ``user_version``: the hook deliveries, the record of
    outputs."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
    row = conn.execute(f"SELECT version FROM {table}").fetchone()
    migrate(conn, steps, 0 if row is None else int(row[0]), path=path, what=what)
    conn.execute(f"DELETE FROM {table}")
    conn.execute(f"INSERT INTO {table} (version) VALUES (?)", (len(steps),))


class Database:
    """One SQLite file in WAL mode with ``synchronous=NORMAL``: a committed write survives a process
    crash (``kill -9``, OOM killer), and readers such as ``ocrwatch status`` never block the daemon.
    ``schema`` migrates the owner's tables in the first write transaction, after the whole file was
    checked.

    Methods are blocking and thread-safe (one connection, one lock). When another process holds the
    write lock, a transaction waits (SQLite's busy handler, then whole-transaction retries through
    tenacity) for up to ``lock_budget`` seconds, then raises ``TransientError``."""

    def __init__(
        self, path: Path, schema: Callable[[sqlite3.Connection], None], *, lock_budget: float = 30.0
    ) -> None:
        self.path = path
        try:
            make_private_dirs(path.parent)
            _private_file(path)
            # SQLite's own busy wait is the first line; tenacity retries the whole transaction
            # around it, which also covers the busy cases that bypass the handler (e.g. WAL recovery
            # by another process).
            self._conn = sqlite3.connect(
                path, timeout=min(1.0, lock_budget), isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.DatabaseError) as exc:
            raise _unusable(path, exc) from None
        self._lock = threading.Lock()
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_is_busy),
            stop=tenacity.stop_after_delay(lock_budget),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
            before_sleep=lambda state: log.warning(
                "ledger_locked", path=str(path), attempt=state.attempt_number
            ),
        )
        self._lock_budget = lock_budget
        try:
            self._open(schema)
        except (OSError, sqlite3.DatabaseError) as exc:
            self._conn.close()
            raise _unusable(path, exc) from None
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _open(self, schema: Callable[[sqlite3.Connection], None]) -> None:
        self._conn.row_factory = sqlite3.Row
        mode = self._with_retries(
            lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        )
        if mode != "wal":
            raise StateUnusable(
                f"the ledger {self.path} cannot use WAL mode (got {mode!r})",
                hint="put state_dir on a local filesystem (WAL needs shared memory; NFS and SMB"
                " cannot do it)",
            )
        self._conn.execute("PRAGMA synchronous = NORMAL")
        # Lookups are by single key: a 512 KiB page cache serves them, and RSS stays flat as the
        # ledger grows.
        self._conn.execute("PRAGMA cache_size = -512")
        # A page damaged in the middle only shows when a query reaches it: checked whole, once,
        # before any use, or lookups would miss rows and documents would be skipped or redone
        # without a word.
        problems = self.transact(
            lambda conn: [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
        )
        if problems != ["ok"]:
            found = " ".join(problems).replace("*** in database main ***", "")
            said = " ".join(found.split())  # one line
            raise StateUnusable(
                f"the ledger {self.path} is damaged: {said}", hint=_MOVE_ASIDE.format(self.path)
            )
        self.transact(schema, write=True)

    def transact(self, body: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        """Run ``body`` in one transaction, retried whole while the database is locked."""

        def attempt() -> T:
            # BEGIN IMMEDIATE takes the write lock up front, so a locked database fails here and
            # never midway.
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = body(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return result

        return self._with_retries(attempt)

    def _with_retries(self, fn: Callable[[], T]) -> T:
        with self._lock:
            try:
                return self._retrying(fn)
            except tenacity.RetryError as exc:
                raise TransientError(
                    f"the ledger {self.path} stayed locked for {self._lock_budget:g}s: "
                    f"{exc.last_attempt.exception()}",
                    hint="another process holds the ledger's write lock; stop it (e.g. a stuck"
                    " sqlite3 shell)",
                ) from exc.last_attempt.exception()


_MOVE_ASIDE = (
    "stop ocrwatch, move the ledger aside (mv {0} {0}.broken) and start again: documents whose"
    " sidecars exist are not processed again"
)


def _unusable(path: Path, exc: OSError | sqlite3.DatabaseError) -> OcrwatchError:
    """What stops the ledger from opening, said in one line with what to do about it. A full disk is
    the one fault that heals by itself, so it stays transient (a restart later may succeed)."""
    code = sqlite_code(exc)
    if code in (SQLITE_NOTADB, SQLITE_CORRUPT):
        return StateUnusable(f"the ledger {path} is damaged: {exc}", hint=_MOVE_ASIDE.format(path))
    if code == SQLITE_FULL or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(
            f"the ledger {path} cannot be opened: {exc}", hint=f"free space on {path.parent}"
        )
    if getattr(exc, "errno", None) == errno.ELOOP:
        return StateUnusable(
            f"the ledger {path} is a symbolic link", hint=f"remove the link {path}"
        )
    return StateUnusable(
        f"the ledger {path} cannot be opened for writing: {exc}",
        hint=f"make {path.parent} and the files in it writable by the user ocrwatch runs as "
        "(on a local, writable filesystem), or point state_dir at another folder",
    )


def _is_busy(exc: BaseException) -> bool:
    busy = (SQLITE_BUSY, SQLITE_LOCKED)
    return isinstance(exc, sqlite3.OperationalError) and sqlite_code(exc) in busy
