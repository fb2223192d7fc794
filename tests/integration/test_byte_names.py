"""A file name that is not UTF-8 (``caf\\xe9.png``, as a Latin-1 system writes it) through
``ocrwatch run`` with a command hook: its sidecars written beside it under the very same bytes, its
hook run once with their paths, and its ledger row done, so a restart does not run it again."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PluginDaemon, sidecars_done, wait_until
from tests.support import docs
from tests.test_hooks import RECORDER, records, script

pytestmark = pytest.mark.integration

NAME = os.fsdecode(b"caf\xe9.png")


def test_a_name_that_is_not_utf8_gets_its_sidecars_and_its_hook(
    plugin_daemon: Callable[..., PluginDaemon], tmp_path: Path
) -> None:
    out = tmp_path / "received"
    record = [sys.executable, script(tmp_path, "r.py", RECORDER), str(out)]
    daemon = plugin_daemon(hook=[{"name": "record", "command": record}])
    daemon.start()
    source = daemon.inbox / NAME
    hidden = docs.write_png(daemon.inbox / ".incoming", ["Cafe menu"])
    os.replace(hidden, source)
    sidecar: dict[str, Any] = wait_until(lambda: sidecars_done(source), 60, "the sidecars")
    assert sidecar["status"] == "ok"
    assert os.fsencode(NAME) + b".md" in os.listdir(os.fsencode(daemon.inbox))
    (received,) = wait_until(lambda: records(out), 60, "the hook's record")
    inbox = os.fsencode(daemon.inbox)
    assert os.fsencode(received["env"]["OCRWATCH_JSON"]) == inbox + b"/caf\xe9.png.json"
    assert os.fsencode(received["env"]["OCRWATCH_MD"]) == inbox + b"/caf\xe9.png.md"
    assert json.loads(received["stdin"]) == sidecar
    assert daemon.stop() == 0
    with closing(sqlite3.connect(daemon.state / "ledger.sqlite3")) as conn:
        state = conn.execute("SELECT state FROM jobs WHERE key = ?", (source.as_uri(),)).fetchall()
        assert state == [("done",)]
        assert conn.execute("SELECT state FROM hook_deliveries").fetchall() == [("done",)]

    daemon.start()
    try:
        (ready,) = [event for event in daemon.events() if event.get("event") == "daemon_ready"]
        assert ready["resumed"] == 0
    finally:
        assert daemon.stop() == 0
    assert len(records(out)) == 1
    assert not [event for event in daemon.all_events() if event.get("level") == "error"]
