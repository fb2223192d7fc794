"""``Deliveries``: the sidecars' paths of a held result kept as bytes, so a file name that is not
UTF-8 is held, moved, released and loaded as it was; a ledger whose hook tables kept them as TEXT is
upgraded in place."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.store import deliveries as deliveries_module
from ocrwatch.store.deliveries import Deliveries
from ocrwatch.store.ledger import Ledger

LATIN1 = os.fsdecode(b"caf\xe9.png")  # as a Latin-1 system writes it: not UTF-8, so not SQLite TEXT


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as opened:
        yield opened


def test_a_name_that_is_not_utf8_is_held_moved_released_and_loaded_byte_for_byte(
    tmp_path: Path, ledger: Ledger
) -> None:
    store = Deliveries(ledger)
    inbox = tmp_path / "inbox"
    json_path, md_path = str(inbox / f"{LATIN1}.json"), str(inbox / f"{LATIN1}.md")
    uri = "file:///inbox/caf%E9.png"
    event = store.hold("me", uri, "ok", uri, json_path, md_path, b"{}", ["ticket"])
    delivery = store.load(event, "ticket")
    assert delivery is not None and (delivery.json, delivery.md) == (json_path, md_path)
    assert os.fsencode(delivery.json).endswith(b"/caf\xe9.png.json")

    archive = tmp_path / "archive"
    archived = {"json": str(archive / f"{LATIN1}.json"), "md": str(archive / f"{LATIN1}.md")}
    assert store.release(event, archived) == ["ticket"]
    store.relocate(uri, archived)
    delivery = store.load(event, "ticket")
    assert delivery is not None
    assert (delivery.json, delivery.md) == (archived["json"], archived["md"])
    assert (delivery.source, delivery.original) == (uri, uri)  # a move that named no source's place
    assert store.pending() == [("ticket", event)]


def test_the_source_moved_is_named_where_it_is_and_where_it_was_dropped(ledger: Ledger) -> None:
    store = Deliveries(ledger)
    uri, there = "file:///inbox/a.png", "file:///archive/inbox/a.png"
    first = store.hold("me", uri, "ok", uri, "/inbox/a.png.json", "/inbox/a.png.md", b"{}", ["t"])
    store.release(first, {"source": there})  # the sidecars under [output] dir stay
    delivery = store.load(first, "t")
    assert delivery is not None and (delivery.source, delivery.original) == (there, uri)
    assert (delivery.json, delivery.md) == ("/inbox/a.png.json", "/inbox/a.png.md")

    other = "file:///inbox/b.png"
    held = store.hold(
        "ended", other, "ok", other, "/inbox/b.png.json", "/inbox/b.png.md", b"{}", ["t"]
    )
    store.relocate(other, {"source": "", "json": "/x/b.png.json", "md": "/x/b.png.md"})  # deleted
    delivery = store.load(held, "t")
    assert delivery is not None and (delivery.source, delivery.original) == ("", other)
    assert (delivery.json, delivery.md) == ("/x/b.png.json", "/x/b.png.md")
    assert store.load(first, "t").source == there  # another document's event untouched


def test_hook_tables_of_schema_1_are_upgraded_in_place_with_their_paths_as_bytes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state" / "ledger.sqlite3"
    Ledger(db).close()
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.executescript(deliveries_module._MIGRATIONS[0])
        conn.execute("CREATE TABLE hook_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO hook_schema (version) VALUES (1)")
        conn.execute(
            "INSERT INTO hook_events (id, key, status, source, json, md, payload, held_by,"
            " created_at) VALUES (7, 'file:///in/caf%C3%A9.pdf', 'ok', 'file:///in/caf%C3%A9.pdf',"
            " '/in/café.pdf.json', '/in/café.pdf.md', x'7b7d', NULL, 1.0)"
        )
        conn.execute(
            "INSERT INTO hook_deliveries (event, hook, state, updated_at)"
            " VALUES (7, 'ticket', 'pending', 1.0)"
        )
    with Ledger(db) as ledger:
        store = Deliveries(ledger)
        assert store.pending() == [("ticket", 7)]
        delivery = store.load(7, "ticket")
        assert delivery is not None
        assert (delivery.json, delivery.md) == ("/in/café.pdf.json", "/in/café.pdf.md")
        assert delivery.original == delivery.source == "file:///in/caf%C3%A9.pdf"
        assert delivery.payload == b"{}"
    with closing(sqlite3.connect(db)) as conn:
        version = conn.execute("SELECT version FROM hook_schema").fetchall()
        assert version == [(deliveries_module.SCHEMA_VERSION,)]
        types = conn.execute("SELECT typeof(json), typeof(md) FROM hook_events").fetchall()
        assert types == [("blob", "blob")]
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(hook_events)")}
        assert {"hook_events_by_key", "hook_events_held"} <= indexes
