"""``ocr``'s skip check asks the one done rule (``sinks.base.records``), through a link the user
named; and ``ocr`` waits without spinning while its engine reads a page."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ocrwatch.control.ocr import _current
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile
from tests.conftest import REPO
from tests.integration.conftest import wait_until
from tests.support import docs
from tests.support.engines_base import StubEngine

BUDGET = 1 << 20
"""``max_bytes`` for the skip check: more than any file here holds."""
# how long the ``ocr`` process is watched while its page is being read
WATCHED_SECONDS = 2.0


def test_a_named_link_is_judged_by_the_file_it_names(tmp_path: Path) -> None:
    data = tmp_path / "real.pdf"
    data.write_bytes(b"%PDF-1.4 fake")
    link = tmp_path / "named.pdf"
    link.symlink_to(data)
    sink = LocalSink()
    job = Job(origin=LocalFile(link, tmp_path), source="cli:1")
    assert not _current(sink, job, BUDGET)  # no sidecar yet
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    paths = sink.paths(job)
    paths["md"].write_text("<!-- page 1 -->\n")
    source = {"bytes": data.stat().st_size, "sha256": digest}
    paths["json"].write_text(json.dumps({"schema": "ocrwatch/1", "source": source}))
    assert _current(sink, job, BUDGET)
    # the file named through the link changed: not done any more
    data.write_bytes(b"%PDF-1.4 other")
    assert not _current(sink, job, BUDGET)
    os.mkfifo(tmp_path / "fifo.pdf")  # never read, never blocks
    assert not _current(
        sink, Job(origin=LocalFile(tmp_path / "fifo.pdf", tmp_path), source="cli:1"), BUDGET
    )


def test_a_file_of_another_size_than_recorded_or_over_its_budget_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size comes from ``fstat`` before a byte is hashed, as admission's does: a file over
    ``max_bytes``, and a done file extended since to a sparse 2 TiB, are not current, unread; the
    file as its sidecar records it is current, read once."""
    from tests.support.sparse import TIB, Reads, sparse_file

    size = 1 << 20
    doc = sparse_file(tmp_path / "doc.pdf", size)
    sink, job = LocalSink(), Job(origin=LocalFile(doc, tmp_path), source="cli:1")
    paths = sink.paths(job)
    paths["md"].write_text("<!-- page 1 -->\n")
    source = {"bytes": size, "sha256": hashlib.sha256(doc.read_bytes()).hexdigest()}
    paths["json"].write_text(json.dumps({"schema": "ocrwatch/1", "source": source}))
    reads = Reads(monkeypatch)
    reads.watch(doc)
    assert not _current(sink, job, size - 1) and reads.bytes == 0
    assert _current(sink, job, size) and reads.bytes == size
    os.truncate(doc, 2 * TIB)
    assert not _current(sink, job, 4 * TIB) and reads.bytes == size


class GatedEngine(StubEngine):
    """Reads a page only when the test lets it: it makes the file ``started``, then waits, in a
    thread that takes no CPU, until a writer opens and closes the FIFO ``gate``; so all the ``ocr``
    process does meanwhile is wait, and the test can measure what that costs."""

    name = "gated"

    def __init__(self, *, started: str, gate: str) -> None:
        super().__init__(max_concurrency=1)
        self.started = Path(started)
        self.gate = Path(gate)

    async def _work(self, page: PageRequest) -> Recognition:
        self.started.touch()
        await asyncio.to_thread(self.gate.read_bytes)  # the FIFO's open blocks until a writer
        return Recognition(markdown="The gated page.", raw="The gated page.")


def _cpu_seconds(pid: int) -> float:
    """User and system time of all of ``pid``'s threads so far, as the kernel counts it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.integration
def test_ocr_sleeps_while_its_engine_reads_a_page(tmp_path: Path) -> None:
    """A page being read costs the ``ocr`` process a progress look twice a second, not a core: a
    finished admission task left in the wait set once ended every wait at once, so the loop spun
    (CPU time equal to the wall time) for as long as the engine took."""
    page = docs.write_png(tmp_path / "page.png", ["A page read slowly"])
    started, gate = tmp_path / "started", tmp_path / "gate"
    os.mkfifo(gate)
    config = tmp_path / "ocrwatch.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[engine]\nkind = "plugin"\n'
        'plugin = "tests.test_control_ocr:GatedEngine"\n'
        f'plugin_args = {{ started = "{started}", gate = "{gate}" }}\n'
    )
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "ocrwatch", "ocr", "--config", str(config), str(page)]
    # files, not pipes: a full pipe would block the process, which then would look idle
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, env={**os.environ, "PYTHONPATH": pythonpath}
        )
    try:
        wait_until(
            lambda: started.exists() or proc.poll() is not None, 120, "the page to be started"
        )
        assert proc.poll() is None, err.read_text()
        cpu, wall = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(WATCHED_SECONDS)  # the page is being read all this while
        share = (_cpu_seconds(proc.pid) - cpu) / (time.monotonic() - wall)
        with gate.open("wb"):  # the engine's page is done
            pass
        assert proc.wait(120) == 0, err.read_text()
    finally:
        proc.kill()
        proc.wait()
    assert out.read_text() == "1 done, 0 skipped, 0 failed\n", err.read_text()
    assert "The gated page." in page.with_name(page.name + ".md").read_text()
    assert share < 0.1, f"ocr used {share:.3f} CPU seconds a second while waiting for its page"
