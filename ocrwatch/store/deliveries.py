"""Hook deliveries, durable: one row per finished document × hook, in the ledger's own SQLite file.

A document's result is recorded here as an *event* (its status, where its source and sidecars are,
where the source was dropped, the JSON sent to the hooks) with one *delivery* per hook that wants
that status. The pipeline records the event **held**, by a token of its process, before it writes
the sidecars, and releases it once the ledger knows the document is finished; only released
deliveries run. A process killed between the two leaves the event held: the next start releases it
when the ledger's row reached the event's final state (the sidecars were written), and drops it
otherwise (the document runs again and records a new one). So a hook runs at least once for every
result that was published, and never for one that was not.

The tables sit beside the ledger's ``jobs`` but have their own schema version (table
``hook_schema``), so the ledger's ``user_version`` stays the ledger's. They are read and written
through the ``Ledger`` itself, on its connection and its one transaction helper: blocking,
thread-safe methods, each one write transaction, retried whole while another connection holds the
write lock. Where the sidecars are (``json``, ``md``) is kept as the path's bytes (``os.fsencode``,
a BLOB): a file name need not be UTF-8, and SQLite's TEXT cannot hold one that is not.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ocrwatch.store.database import Migration, StateUnusable, migrate_versioned
from ocrwatch.store.ledger import Ledger

T = TypeVar("T")

# Each entry upgrades hook_schema's version from i to i + 1; append, never edit.
_MIGRATIONS: tuple[Migration, ...] = (
    """
    CREATE TABLE hook_events (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'partial', 'failed')),
        source TEXT NOT NULL,
        json TEXT NOT NULL,
        md TEXT NOT NULL,
        payload BLOB,
        held_by TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX hook_events_by_key ON hook_events (key);
    CREATE INDEX hook_events_held ON hook_events (held_by) WHERE held_by IS NOT NULL;
    CREATE TABLE hook_deliveries (
        event INTEGER NOT NULL,
        hook TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        updated_at REAL NOT NULL,
        PRIMARY KEY (event, hook)
    ) WITHOUT ROWID;
    CREATE INDEX hook_deliveries_pending ON hook_deliveries (event) WHERE state = 'pending';
    """,
    # The sidecars' paths as bytes: a name that is not UTF-8 cannot be TEXT. What TEXT held was
    # UTF-8, whose bytes the cast keeps.
    """
    CREATE TABLE hook_events_new (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'partial', 'failed')),
        source TEXT NOT NULL,
        json BLOB NOT NULL,
        md BLOB NOT NULL,
        payload BLOB,
        held_by TEXT,
        created_at REAL NOT NULL
    );
    INSERT INTO hook_events_new SELECT id, key, status, source, CAST(json AS BLOB),
        CAST(md AS BLOB), payload, held_by, created_at FROM hook_events;
    DROP TABLE hook_events;
    ALTER TABLE hook_events_new RENAME TO hook_events;
    CREATE INDEX hook_events_by_key ON hook_events (key);
    CREATE INDEX hook_events_held ON hook_events (held_by) WHERE held_by IS NOT NULL;
    """,
    # Where the source was dropped, once ``source`` names where a move took it.
    """
    ALTER TABLE hook_events ADD COLUMN original TEXT;
    UPDATE hook_events SET original = source;
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)


@dataclass(frozen=True)
class HookDelivery:
    """One hook's delivery of one event, with what the hook is given."""

    event: int
    hook: str
    key: str
    status: str
    source: str  # where the source is now: its URI, "" once deleted
    original: str  # where it was dropped: its URI
    json: str
    md: str
    payload: bytes
    state: str
    attempts: int


class Deliveries:
    """The hook-delivery tables of ``ledger``'s file, made or upgraded when first opened."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        try:
            self.transact(self._migrate)
        except sqlite3.DatabaseError as exc:
            raise StateUnusable(
                f"the ledger {ledger.path} cannot hold hook deliveries: {exc}"
            ) from None

    def hold(
        self,
        token: str,
        key: str,
        status: str,
        source: str,
        json: str,
        md: str,
        payload: bytes,
        hooks: Sequence[str],
    ) -> int:
        """Record a result not yet published, with a pending delivery per hook; its id. An event of
        the same document that this process still holds is superseded (that attempt failed before
        publishing), and the document's finished events are forgotten: only its latest result's
        deliveries are kept."""

        def tx(conn: sqlite3.Connection) -> int:
            stale = [
                row[0]
                for row in conn.execute(
                    "SELECT e.id FROM hook_events e WHERE e.key = ? AND (e.held_by = ? OR "
                    "(e.held_by IS NULL AND NOT EXISTS (SELECT 1 FROM hook_deliveries d WHERE "
                    "d.event = e.id AND d.state = 'pending')))",
                    (key, token),
                )
            ]
            _delete(conn, stale)
            now = time.time()
            event = conn.execute(
                "INSERT INTO hook_events (key, status, source, original, json, md, payload,"
                " held_by, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    status,
                    source,
                    source,
                    os.fsencode(json),
                    os.fsencode(md),
                    payload,
                    token,
                    now,
                ),
            ).lastrowid
            assert event is not None
            conn.executemany(
                "INSERT INTO hook_deliveries (event, hook, state, updated_at) VALUES (?, ?, "
                "'pending', ?)",
                [(event, hook, now) for hook in hooks],
            )
            return event

        return self.transact(tx)

    def release(self, event: int, moved: Mapping[str, str] | None = None) -> list[str]:
        """Publish a held event: its deliveries may run. ``moved``: where its source (``source``)
        and its ``json`` and ``md`` sidecars are now (``archive.apply_on_success``: ``on_success``
        took them), recorded first. The hooks with a pending delivery of it."""
        columns, values = _moved(moved or {})

        def tx(conn: sqlite3.Connection) -> list[str]:
            if columns:
                conn.execute(f"UPDATE hook_events SET {columns} WHERE id = ?", (*values, event))
            conn.execute("UPDATE hook_events SET held_by = NULL WHERE id = ?", (event,))
            return [
                row[0]
                for row in conn.execute(
                    "SELECT hook FROM hook_deliveries WHERE event = ? AND state = 'pending' ORDER "
                    "BY hook",
                    (event,),
                )
            ]

        return self.transact(tx)

    def relocate(self, key: str, moved: Mapping[str, str]) -> None:
        """The ``ok`` events of the document ``key``, wherever they are held, name its source and
        sidecars where ``on_success`` took them (as for ``release``): a start that finds a document
        done moves it after the process that held them ended."""
        columns, values = _moved(moved)
        if not columns:
            return
        self.transact(
            lambda conn: conn.execute(
                f"UPDATE hook_events SET {columns} WHERE key = ? AND status = 'ok'", (*values, key)
            )
        )

    def drop(self, event: int) -> None:
        """Forget an event whose result was never published."""
        self.transact(lambda conn: _delete(conn, [event]))

    def held_elsewhere(self, token: str) -> list[tuple[int, str, str]]:
        """Events held by other processes (ended before releasing them): id, document key,
        status."""
        return self.transact(
            lambda conn: [
                (row["id"], row["key"], row["status"])
                for row in conn.execute(
                    "SELECT id, key, status FROM hook_events WHERE held_by IS NOT NULL AND "
                    "held_by != ? ORDER BY id",
                    (token,),
                )
            ]
        )

    def pending(self) -> list[tuple[str, int]]:
        """Deliveries of released events still to run, oldest first: hook, event."""
        return self.transact(
            lambda conn: [
                (row[0], row[1])
                for row in conn.execute(
                    "SELECT d.hook, d.event FROM hook_deliveries d JOIN hook_events e ON e.id = "
                    "d.event WHERE d.state = 'pending' AND e.held_by IS NULL ORDER BY d.event, "
                    "d.hook"
                )
            ]
        )

    def load(self, event: int, hook: str) -> HookDelivery | None:
        def tx(conn: sqlite3.Connection) -> HookDelivery | None:
            row = conn.execute(
                "SELECT e.key, e.status, e.source, e.original, e.json, e.md, e.payload, d.state,"
                " d.attempts FROM hook_deliveries d JOIN hook_events e ON e.id = d.event"
                " WHERE d.event = ? AND d.hook = ?",
                (event, hook),
            ).fetchone()
            if row is None:
                return None
            return HookDelivery(
                event,
                hook,
                row["key"],
                row["status"],
                row["source"],
                row["original"],
                os.fsdecode(row["json"]),
                os.fsdecode(row["md"]),
                bytes(row["payload"] or b""),
                row["state"],
                row["attempts"],
            )

        return self.transact(tx)

    def start_attempt(self, event: int, hook: str) -> int:
        """Count an attempt before it runs (a daemon killed meanwhile has used it); the total."""

        def tx(conn: sqlite3.Connection) -> int:
            conn.execute(
                "UPDATE hook_deliveries SET attempts = attempts + 1, updated_at = ? WHERE event = "
                "? AND hook = ?",
                (time.time(), event, hook),
            )
            row = conn.execute(
                "SELECT attempts FROM hook_deliveries WHERE event = ? AND hook = ?", (event, hook)
            )
            return int(row.fetchone()[0])

        return self.transact(tx)

    def give_back(self, event: int, hook: str) -> None:
        """A clean stop interrupted the attempt: it does not count."""
        self.transact(
            lambda conn: conn.execute(
                "UPDATE hook_deliveries SET attempts = max(attempts - 1, 0) WHERE event = ? AND "
                "hook = ?",
                (event, hook),
            )
        )

    def finish(self, event: int, hook: str, state: str, error: str | None) -> None:
        """``done`` or ``failed`` (attempts spent); the payload goes once no delivery of the event
        waits."""

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE hook_deliveries SET state = ?, last_error = ?, updated_at = ? WHERE event "
                "= ? AND hook = ?",
                (state, error, time.time(), event, hook),
            )
            conn.execute(
                "UPDATE hook_events SET payload = NULL WHERE id = ? AND NOT EXISTS"
                " (SELECT 1 FROM hook_deliveries WHERE event = ? AND state = 'pending')",
                (event, event),
            )

        self.transact(tx)

    # --- plumbing ---------------------------------------------------------------------------------

    def _migrate(self, conn: sqlite3.Connection) -> None:
        migrate_versioned(
            conn, "hook_schema", _MIGRATIONS, path=self._ledger.path, what="hook schema"
        )

    def transact(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return self._ledger.transact(body, write=True)  # the ledger's lock, connection and retries


def _moved(moved: Mapping[str, str]) -> tuple[str, tuple[str | bytes, ...]]:
    """The columns ``moved`` sets (``source``; ``json`` and ``md``, as the paths' bytes), and their
    values."""
    columns: list[str] = []
    values: list[str | bytes] = []
    if "source" in moved:
        columns.append("source = ?")
        values.append(moved["source"])
    if "json" in moved:
        columns += ["json = ?", "md = ?"]
        values += [os.fsencode(moved["json"]), os.fsencode(moved["md"])]
    return ", ".join(columns), tuple(values)


def _delete(conn: sqlite3.Connection, events: list[int]) -> None:
    conn.executemany("DELETE FROM hook_deliveries WHERE event = ?", [(event,) for event in events])
    conn.executemany("DELETE FROM hook_events WHERE id = ?", [(event,) for event in events])
