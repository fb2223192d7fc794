"""``ocr``'s skip check asks the one done rule (``sinks.base.records``), through a link the user
named."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ocrwatch.control.ocr import _current
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile


def test_a_named_link_is_judged_by_the_file_it_names(tmp_path: Path) -> None:
    data = tmp_path / "real.pdf"
    data.write_bytes(b"%PDF-1.4 fake")
    link = tmp_path / "named.pdf"
    link.symlink_to(data)
    sink = LocalSink()
    job = Job(origin=LocalFile(link, tmp_path), source="cli:1")
    assert not _current(sink, job)  # no sidecar yet
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    paths = sink.paths(job)
    paths["md"].write_text("<!-- page 1 -->\n")
    source = {"bytes": data.stat().st_size, "sha256": digest}
    paths["json"].write_text(json.dumps({"schema": "ocrwatch/1", "source": source}))
    assert _current(sink, job)
    # the file named through the link changed: not done any more
    data.write_bytes(b"%PDF-1.4 other")
    assert not _current(sink, job)
    os.mkfifo(tmp_path / "fifo.pdf")  # never read, never blocks
    assert not _current(
        sink, Job(origin=LocalFile(tmp_path / "fifo.pdf", tmp_path), source="cli:1")
    )
