"""Names an inbox never takes: the built-in ignore list, an inbox's own ``ignore`` globs (a trailing
``/`` for a folder), hidden names and sidecars, asked alike by the scan, the watcher and ``ocrwatch
ocr DIR``'s walk."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest
from pydantic import ValidationError

from ocrwatch.config import InboxConfig
from ocrwatch.sources.ignore import BUILTIN_IGNORE, NameRules, sidecar_suffixes
from ocrwatch.sources.inbox import Inbox

EVERYTHING = ("*",)
SIDECARS = sidecar_suffixes("{name}")


@pytest.mark.parametrize(
    "name",
    [
        ".DS_Store",
        "._scan.pdf",
        "Thumbs.db",
        "THUMBS.DB",
        "desktop.ini",
        "Desktop.INI",
        "scan.pdf.part",
        "scan.pdf.crdownload",
        "scan.pdf.tmp",
        "~$report.docx",
        ".hidden.pdf",
        "scan.pdf.md",
        "scan.pdf.json",
        "scan.pdf.error.json",
    ],
)
def test_built_in_and_hidden_files_are_never_taken(name: str) -> None:
    rules = NameRules(EVERYTHING, (), SIDECARS)
    assert rules.ignores(name) and not rules.takes(PurePath("/inbox") / name)


@pytest.mark.parametrize("name", ["@eaDir", "@EADIR", ".stfolder", "__MACOSX", ".git", ".Trash-0"])
def test_built_in_and_hidden_folders_are_never_entered(name: str) -> None:
    assert not NameRules(EVERYTHING, (), SIDECARS).enters(name)


def test_ordinary_names_are_taken_and_entered() -> None:
    rules = NameRules(("*.pdf", "*.png"), (), SIDECARS)
    for name in ("scan.pdf", "SCAN.PDF", "Thumbs.db.pdf", "desk top.png", "a~$b.pdf", "eaDir.pdf"):
        assert rules.takes(PurePath("/inbox") / name), name
    assert not rules.takes(PurePath("/inbox/notes.txt"))
    for name in ("2024", "eaDir", "MACOSX", "stfolder", "Thumbs.db"):
        assert rules.enters(name), name


def test_configured_globs_add_to_the_built_ins() -> None:
    rules = NameRules(
        EVERYTHING, ("*.bak", "draft-??.pdf", "[0-9]*.png", "scratch/", "Old*/"), SIDECARS
    )
    for name in ("scan.bak", "SCAN.BAK", "draft-01.pdf", "2024.png", "Thumbs.db"):
        assert rules.ignores(name), name
    for name in ("draft-001.pdf", "a2024.png", "scratch", "scan.pdf"):
        assert not rules.ignores(name), name
    for name in ("scratch", "SCRATCH", "Old", "older papers", "@eaDir"):
        assert not rules.enters(name), name
    assert rules.enters("scratch.pdf") and rules.enters("bold")


def test_a_folder_pattern_names_no_file_and_a_file_pattern_no_folder() -> None:
    rules = NameRules(EVERYTHING, ("scratch/", "*.bak"), SIDECARS)
    assert not rules.ignores("scratch") and rules.enters("backup.bak")


def test_outputs_are_never_taken() -> None:
    rules = NameRules(EVERYTHING, (), SIDECARS)
    assert not rules.takes(PurePath("/inbox/scan.ocr.pdf"))
    assert not rules.takes(PurePath("/inbox/scan.pdf.assets/page-1-figure-1.png"))


def test_sidecar_endings_follow_the_template() -> None:
    assert SIDECARS == (".md", ".json", ".json")
    assert sidecar_suffixes("{stem}.ocr") == (".md", ".json", ".json")


def test_the_built_ins_are_those_the_documentation_names() -> None:
    example = (Path(__file__).resolve().parent.parent / "config.example.toml").read_text()
    for pattern in BUILTIN_IGNORE:
        assert pattern in example, pattern


def test_the_inbox_applies_the_rules_to_files_and_to_every_folder_on_the_way(
    tmp_path: Path,
) -> None:
    config = InboxConfig(path=tmp_path, patterns=("*.png",), ignore=("drafts/", "*-old.png"))
    inbox = Inbox(tmp_path, config, SIDECARS)
    assert inbox.accepts(tmp_path / "a" / "scan.png")
    assert not inbox.accepts(tmp_path / "._scan.png")
    assert not inbox.accepts(tmp_path / "scan-old.png")
    assert not inbox.accepts(tmp_path / "drafts" / "scan.png")
    assert not inbox.accepts(tmp_path / "a" / "@eaDir" / "b" / "scan.png")
    assert not inbox.allows(tmp_path / "a" / "__MACOSX") and inbox.allows(tmp_path / "a")
    inbox.configure(config.model_copy(update={"ignore": ()}))  # a reload takes the new list
    assert inbox.accepts(tmp_path / "drafts" / "scan.png")


@pytest.mark.parametrize("pattern", ["a/b", "/abs", "", "x\x00"])
def test_an_ignore_pattern_is_one_name(pattern: str) -> None:
    with pytest.raises(ValidationError, match="ignore"):
        InboxConfig(ignore=(pattern,))


@pytest.mark.parametrize("seconds", [0, 0.05, 3601])
def test_poll_seconds_is_bounded(seconds: float) -> None:
    with pytest.raises(ValidationError, match="poll_seconds"):
        InboxConfig(poll_seconds=seconds)
