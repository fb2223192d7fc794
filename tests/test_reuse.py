"""Which earlier results a copy of the same bytes may take: ``ok`` ones of these very bytes, with
nothing beyond the two sidecars; the copy's JSON names the earlier file and describes the copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ocrwatch.reuse import _adapted, _reusable
from ocrwatch.sinks.base import Recalled
from ocrwatch.sources.base import Job, LocalFile

SHA = "ab" * 32


def result(**members: Any) -> dict[str, Any]:
    return {"status": "ok", "source": {"uri": "file:///in/a.png", "sha256": SHA}, "pages": [{"page": 1}],
            **members}  # fmt: skip


def test_only_an_ok_result_of_the_same_bytes_with_no_further_outputs_is_reusable() -> None:
    assert _reusable(result(), SHA)
    assert not _reusable(result(status="partial"), SHA)
    assert not _reusable(result(), "cd" * 32)
    assert not _reusable(result(source={"uri": "file:///in/a.png"}), SHA)
    assert not _reusable(result(searchable_pdf={"name": "a.png.ocr.pdf"}), SHA)
    assert not _reusable(result(figures=[]), SHA)


def test_the_copy_describes_itself_and_names_the_earlier_file() -> None:
    inbox = Path("/in")
    earlier = Job(origin=LocalFile(inbox / "a.png", inbox), source="local")
    copy = Job(origin=LocalFile(inbox / "b.png", inbox), source="local")
    source = {"uri": copy.origin.uri, "name": "b.png", "bytes": 3, "sha256": SHA}
    reused = _adapted(Recalled(b"<!-- page 1 -->\ntext\n", result()), earlier, copy, source, 0.0)
    assert reused.document["source"] == source
    assert reused.document["reused_from"] == earlier.origin.uri
    assert reused.document["pages"] == [{"page": 1}] and reused.markdown.endswith("text\n")
