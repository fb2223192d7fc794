"""``[output] dir`` with the daemon as a real process: relative to the configuration file, one
folder per inbox, and a sidecar that goes missing is noticed and its document done again."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.integration.conftest import PluginDaemon, wait_until
from tests.support import docs

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.integration


def two_inboxes(root: Path, plugin_daemon: Any) -> PluginDaemon:
    """Inboxes ``a`` and ``b``, each with ``sub/report.pdf`` (different content); the configuration
    in ``root/etc`` names ``dir = "out"``, while the daemon runs in ``root``."""
    inboxes = [{"path": str(root / name), "settle_seconds": 0.2} for name in ("a", "b")]
    daemon: PluginDaemon = plugin_daemon(inboxes=inboxes)
    settings = tomllib.loads(daemon.config_path.read_text())
    settings["output"] = {"dir": "out"}
    (root / "etc").mkdir()
    daemon.config_path = root / "etc" / "ocrwatch.toml"
    daemon.config_path.write_text(tomli_w.dumps(settings))
    for name in ("a", "b"):
        (root / name / "sub").mkdir(parents=True)
        docs.write_pdf(root / name / "sub" / "report.pdf", [[f"Report of inbox {name}"]])
    return daemon


def sidecar(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def test_two_inboxes_with_the_same_names_keep_their_sidecars_apart(
    tmp_path: Path, plugin_daemon: Any
) -> None:
    daemon = two_inboxes(tmp_path, plugin_daemon)
    # beside the configuration file, not in the daemon's working folder
    out = tmp_path / "etc" / "out"
    daemon.start()
    try:
        done = {
            name: wait_until(
                lambda name=name: sidecar(out / name / "sub" / "report.pdf.json"),
                60,
                f"{name}'s sidecar in {out}",
            )
            for name in ("a", "b")
        }
    finally:
        assert daemon.stop() == 0
    for name in ("a", "b"):
        digest = hashlib.sha256((tmp_path / name / "sub" / "report.pdf").read_bytes()).hexdigest()
        assert done[name]["source"]["sha256"] == digest
        assert done[name]["source"]["uri"].endswith(f"/{name}/sub/report.pdf")
        assert (out / name / "sub" / "report.pdf.md").exists()
    assert done["a"]["source"]["sha256"] != done["b"]["source"]["sha256"]
    assert not (tmp_path / "out").exists() and not list((tmp_path / "a").rglob("*.json"))


def test_a_deleted_sidecar_is_noticed_at_the_next_start_and_redone(
    tmp_path: Path, plugin_daemon: Any
) -> None:
    daemon = two_inboxes(tmp_path, plugin_daemon)
    out = tmp_path / "etc" / "out"
    daemon.start()
    try:
        for name in ("a", "b"):
            wait_until(
                lambda name=name: sidecar(out / name / "sub" / "report.pdf.json"),
                60,
                f"{name}'s sidecar",
            )
    finally:
        assert daemon.stop() == 0
    lost, kept = out / "a" / "sub" / "report.pdf.json", out / "b" / "sub" / "report.pdf.json"
    kept_before = kept.stat().st_mtime_ns
    lost.unlink()
    daemon.start()
    try:
        redone = wait_until(lambda: sidecar(lost), 60, "the deleted sidecar written again")
    finally:
        assert daemon.stop() == 0
    assert (
        redone["source"]["sha256"]
        == hashlib.sha256((tmp_path / "a" / "sub" / "report.pdf").read_bytes()).hexdigest()
    )
    events = daemon.events()  # the second run's
    assert [e["uri"] for e in events if e["event"] == "job_sidecars_missing"] == [
        (tmp_path / "a" / "sub" / "report.pdf").as_uri()
    ]
    assert kept.stat().st_mtime_ns == kept_before, (
        "a document whose sidecar is there was done again"
    )
    assert sum(e["event"] == "job_done" for e in events) == 1
    # a redo never counts toward crash_loop
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert db.execute("SELECT state, attempts FROM jobs").fetchall() == [
            ("done", 1),
            ("done", 1),
        ]
