"""``ocrwatch run`` as a real process on an inbox that takes every name (``patterns = ["*"]``): what
scanners, file shares and downloads leave beside documents, and what the inbox's ``ignore`` names,
is neither OCRed nor refused, whether it was there at the start (the scan) or came later (the
watcher, native or polled); the documents beside it are done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import error_sidecar, sidecars_done, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

IGNORED = [
    ".DS_Store",
    "._scan.png",
    "Thumbs.db",
    "THUMBS.DB",
    "desktop.ini",
    "@eaDir/scan.png/SYNOFILE_THUMB_M.jpg",
    "@eaDir/other.png",
    ".stfolder/scan.png",
    "__MACOSX/scan.png",
    "scan.png.part",
    "scan.png.crdownload",
    "~$scan.png",
    "scan.png.bak",
    "drafts/scan.png",
    "sub/Drafts/deeper/scan.png",
]
"""Built-ins and the configured ``*.bak`` and ``drafts/``; each a real PNG that would be OCRed
otherwise."""


def drop(folder: Path, names: list[str], tag: str) -> list[Path]:
    made = []
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        made.append(docs.write_png(path, [f"Ignored {tag} page"]))
    return made


def untouched(path: Path) -> bool:
    """No sidecar of any kind beside ``path``, nor an error one."""
    return not any(
        path.with_name(path.name + suffix).exists() for suffix in (".md", ".json", ".error.json")
    )


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polled"])
def test_ignored_names_are_dropped_silently_and_documents_beside_them_done(
    make_daemon, tmp_path: Path, polling: bool
) -> None:
    daemon = make_daemon(
        inboxes=[
            {
                "path": str(tmp_path / "inbox"),
                "patterns": ["*"],
                "ignore": ["*.bak", "drafts/"],
                "settle_seconds": 0.2,
                "polling": polling,
                "poll_seconds": 0.2,
            }
        ]
    )
    inbox = daemon.inbox
    before = drop(inbox / "before", IGNORED, "before")
    first = docs.write_png(inbox / "before" / "keep.png", ["Kept before start"])
    daemon.start()
    after = drop(inbox / "after", IGNORED, "after")
    second = docs.write_png(inbox / "after" / "keep.png", ["Kept after start"])
    for document in (first, second):
        wait_until(
            lambda document=document: sidecars_done(document) or error_sidecar(document),
            90,
            f"{document} done",
        )
        assert sidecars_done(document) is not None, error_sidecar(document)
    assert "Kept" in second.with_name("keep.png.md").read_text()
    daemon.stop()
    assert [path for path in before + after if not untouched(path)] == []
    named = [text for path in before + after for text in (str(path), path.as_uri())]
    events = daemon.events()
    assert [
        event for event in events if event.get("level") in ("warning", "error", "critical")
    ] == []
    assert [event for event in events if any(text in json.dumps(event) for text in named)] == []
    started = sorted(event["uri"] for event in events if event.get("event") == "job_started")
    assert started == sorted(path.as_uri() for path in (first, second))
