"""A sidecar deleted while the daemon runs: the periodic scan notices it and the document is done
again, while a document whose sidecars are in place is left alone. ``[output] dir`` keeps the
sidecars out of the inbox, so no watchdog event helps: what is shown is the scan (the event path is
``test_sources_local``'s)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import wait_until
from tests.support import docs

pytestmark = pytest.mark.integration


def sidecar(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def test_a_sidecar_deleted_while_running_is_written_again_and_only_that_one(
    tmp_path: Path, make_daemon: Any
) -> None:
    daemon = make_daemon(daemon={"reconcile_seconds": 0.5}, output={"dir": str(tmp_path / "out")})
    out = tmp_path / "out" / "inbox"  # the inbox's folder under [output] dir
    for name in ("kept", "lost"):
        docs.write_png(daemon.inbox / f"{name}.png", [f"The {name} page"])
    daemon.start()
    try:
        for name in ("kept", "lost"):
            wait_until(lambda name=name: sidecar(out / f"{name}.png.json"), 30, f"{name}'s sidecar")
        kept_written = (out / "kept.png.json").stat().st_mtime_ns
        (out / "lost.png.json").unlink()
        redone = wait_until(
            lambda: sidecar(out / "lost.png.json"), 10, "the deleted sidecar written again"
        )
        wait_until(lambda: (out / "lost.png.md").exists(), 10, "its Markdown written again with it")
        (out / "lost.png.md").unlink()  # the Markdown alone: the document is done again too
        wait_until(lambda: (out / "lost.png.md").exists(), 10, "the deleted Markdown written again")
        time.sleep(1.5)  # three more scans, each of which asks for both documents
    finally:
        assert daemon.stop() == 0
    lost = (daemon.inbox / "lost.png").resolve()
    assert redone["source"]["uri"] == lost.as_uri()
    assert (out / "kept.png.json").stat().st_mtime_ns == kept_written
    events = daemon.events()
    assert [e["path"] for e in events if e["event"] == "local_sidecars_lapsed"] == [str(lost)] * 2
    assert [e["uri"] for e in events if e["event"] == "job_sidecars_missing"] == [lost.as_uri()] * 2
    assert sum(e["event"] == "job_done" for e in events) == 4
    # a scan does not even submit kept.png
    assert not [e for e in events if e["event"] == "job_already_done"]
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert sorted(db.execute("SELECT state, attempts FROM jobs").fetchall()) == [
            ("done", 1),
            ("done", 1),
        ]
