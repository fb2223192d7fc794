"""Which earlier results a copy of the same bytes may take: ``ok`` ones of these very bytes, with
nothing beyond the two sidecars; the copy's JSON names the earlier file and describes the copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ocrwatch.jobs.reuse import _adapted, _reusable, _same_place
from ocrwatch.results.assemble import Provenance
from ocrwatch.sinks.base import Recalled
from ocrwatch.sources.base import Job, LocalFile

SHA = "ab" * 32
ENGINE = {"name": "tesseract", "lang": "eng", "prompt": ""}
RENDER = {"dpi": 300, "max_side": None, "max_pixels": 40000000}
READ = Provenance(source={}, engine=ENGINE, render=RENDER)


def result(**members: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "source": {"uri": "file:///in/a.png", "sha256": SHA},
        "engine": ENGINE,
        "render": RENDER,
        "pages": [{"page": 1}],
        **members,
    }


def test_only_an_ok_result_of_the_same_bytes_with_no_further_outputs_is_reusable() -> None:
    assert _reusable(result(), SHA, READ)
    assert not _reusable(result(status="partial"), SHA, READ)
    assert not _reusable(result(), "cd" * 32, READ)
    assert not _reusable(result(source={"uri": "file:///in/a.png"}), SHA, READ)
    assert not _reusable(result(searchable_pdf={"name": "a.png.ocr.pdf"}), SHA, READ)
    assert not _reusable(result(figures=[]), SHA, READ)


def test_a_result_read_otherwise_or_in_another_inbox_is_not_reused() -> None:
    assert not _reusable(result(engine={**ENGINE, "lang": "deu"}), SHA, READ)
    assert not _reusable(result(render={**RENDER, "dpi": 150}), SHA, READ)
    one, other = Path("/in"), Path("/other")
    job = Job(origin=LocalFile(one / "b.png", one), source="local")
    assert _same_place(Job(origin=LocalFile(one / "a.png", one), source="local"), job)
    assert not _same_place(Job(origin=LocalFile(other / "a.png", other), source="local"), job)


def test_the_copy_describes_itself_and_names_the_earlier_file() -> None:
    inbox = Path("/in")
    earlier = Job(origin=LocalFile(inbox / "a.png", inbox), source="local")
    copy = Job(origin=LocalFile(inbox / "b.png", inbox), source="local")
    source = {"uri": copy.origin.uri, "name": "b.png", "bytes": 3, "sha256": SHA}
    reused = _adapted(Recalled(b"<!-- page 1 -->\ntext\n", result()), earlier, copy, source, 0.0)
    assert reused.document["source"] == source
    assert reused.document["reused_from"] == earlier.origin.uri
    assert reused.document["pages"] == [{"page": 1}] and reused.markdown.endswith("text\n")
