"""``Pipeline.reject``, the one error-sidecar writer, as a source sees it: a job given up without
being run is logged, recorded in the ledger, reported beside its source and acknowledged; a
duplicate of a job already done is acknowledged as done instead. And a run whose source changed
after its pages were read publishes nothing of the old bytes."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ocrwatch.config import Config
from ocrwatch.errors import OutputNotWritable, PermanentError, SourceGone
from ocrwatch.infra.metrics import Metrics
from ocrwatch.jobs.jobrun import Asked
from ocrwatch.jobs.pipeline import Pipeline
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources import sourcefile
from ocrwatch.sources.base import Fetched, Job, LocalFile, Outcome, S3Object
from ocrwatch.sources.local import LocalSource
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Ledger
from tests.support import docs
from tests.test_sources_local import until


class Poison(PermanentError):
    kind = "too_many_deliveries"


class RecordingSource:
    name = "s3:0"

    def __init__(self) -> None:
        self.finished: list[tuple[str, Outcome]] = []
        self.kinds: list[str | None] = []

    async def start(self, submit: Any, reject: Any) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def fetch(self, job: Job, spool_dir: Path, read: Any = None) -> Path:
        raise AssertionError("a rejected job is never fetched")

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        self.finished.append((job.key, outcome))
        self.kinds.append(kind)


class MemorySink:
    def __init__(
        self, recorded: dict[str, Any] | None = None, refusal: Exception | None = None
    ) -> None:
        self.errors: list[dict[str, Any]] = []
        self._recorded = recorded
        self._refusal = refusal

    def recorded(self, job: Job) -> dict[str, Any] | None:
        return self._recorded

    def write(self, job: Job, markdown: str, document: dict[str, Any], *rest: Any) -> None:
        raise AssertionError("a rejected job has no result")

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        if self._refusal is not None:
            raise self._refusal
        self.errors.append(error)


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as ledger:
        yield ledger


def pipeline(tmp_path: Path, ledger: Ledger, sink: MemorySink) -> tuple[Pipeline, RecordingSource]:
    source = RecordingSource()
    made = Pipeline(Config(state_dir=tmp_path / "state"), AsyncLedger(ledger), Metrics())
    made.add_source(source, sink)
    return made, source


def job(etag: str = '"e1"') -> Job:
    return Job(
        origin=S3Object(bucket="docs", key="in/poison.pdf", etag=etag, size=12), source="s3:0"
    )


async def test_a_source_rejection_is_logged_recorded_reported_and_acknowledged(
    tmp_path: Path, ledger: Ledger
) -> None:
    sink = MemorySink()
    made, source = pipeline(tmp_path, ledger, sink)
    with capture_logs() as logs:
        await made.reject(job(), Poison("delivered 4 times"), 4)
    assert [e["event"] for e in logs] == ["job_failed"] and logs[0]["kind"] == "too_many_deliveries"
    row = ledger.known(job().key)
    assert row is not None and row.state == "failed" and row.last_error is not None
    assert row.last_error["kind"] == "too_many_deliveries"
    [error] = sink.errors
    assert (error["status"], error["attempts"], error["error"]["kind"]) == (
        "failed",
        4,
        "too_many_deliveries",
    )
    assert (
        error["source"] | {"uri": "s3://docs/in/poison.pdf", "etag": '"e1"', "bytes": 12}
        == error["source"]
    )
    assert source.finished == [(job().key, "failed")]
    assert made.metrics.documents.labels(status="failed")._value.get() == 1


async def test_a_rejected_duplicate_of_a_done_job_is_acknowledged_as_done(
    tmp_path: Path, ledger: Ledger
) -> None:
    sink = MemorySink(recorded={"uri": "s3://docs/in/poison.pdf", "bytes": 12, "etag": '"e1"'})
    made, source = pipeline(tmp_path, ledger, sink)
    await made.reject(job(), Poison("delivered 4 times"), 4)
    assert sink.errors == [] and source.finished == [(job().key, "done")]
    row = ledger.known(job().key)
    assert row is not None and row.state == "done"

    await made.reject(job(etag='"e2"'), Poison("delivered 4 times"), 4)  # another version: not done
    assert len(sink.errors) == 1 and source.finished[-1] == (job().key, "failed")


async def test_a_vanished_source_gets_no_error_sidecar(tmp_path: Path, ledger: Ledger) -> None:
    sink = MemorySink()
    made, source = pipeline(tmp_path, ledger, sink)
    await made.reject(job(), SourceGone("s3://docs/in/poison.pdf is gone"), 1)
    assert sink.errors == [] and source.finished == [(job().key, "failed")]
    row = ledger.known(job().key)
    assert row is not None and row.state == "failed"


@pytest.mark.parametrize(
    ("refusal", "kind"),
    [
        (SourceGone("its folder in/ is a symlink; links are not followed"), "source_gone"),
        (
            OutputNotWritable("cannot write sidecars in in/: the filesystem is read-only"),
            "too_many_deliveries",
        ),
    ],
    ids=["path-fault", "place-kept"],
)
async def test_an_error_sidecar_a_swapped_folder_kept_out_leaves_the_document_to_come_back(
    tmp_path: Path, ledger: Ledger, refusal: Exception, kind: str
) -> None:
    """A failure whose error sidecar could not be written for what its path was then is recorded as
    that fault, which the ledger admits again once the file is seen whole: it never stands where no
    one can see it. A sidecar kept out by the place itself (read-only) leaves the failure as it
    was, for its hint's fix."""
    made, source = pipeline(tmp_path, ledger, MemorySink(refusal=refusal))
    with capture_logs() as logs:
        await made.reject(job(), Poison("delivered 4 times"), 4)
    assert [e["event"] for e in logs] == ["job_failed", "error_sidecar_failed"]
    row = ledger.known(job().key)
    assert row is not None and row.state == "failed" and row.last_error["kind"] == kind
    assert source.finished == [(job().key, "failed")] and source.kinds == [kind]
    fingerprint = made.admission.fingerprint(job())
    assert fingerprint is not None
    assert ledger.admit(job(), fingerprint) is (kind == "source_gone")


class RewrittenSource:
    """A local source whose file is rewritten once its first version's pages are recognised: the
    first fetch's ``changed`` says so from its second question on (the one asked right before
    publishing), every later fetch reads the new version, unchanged."""

    name = "local"

    def __init__(self, old: Path, new: Path) -> None:
        self.versions = [old, new]
        self.fetched: list[str] = []
        self.finished: list[Outcome] = []

    async def fetch(self, job: Job, spool_dir: Path, read: Any = None) -> Fetched:
        data = self.versions[min(len(self.fetched), 1)].read_bytes()
        self.fetched.append(hashlib.sha256(data).hexdigest())
        copy = spool_dir / "source.pdf"
        copy.write_bytes(data)
        asked = itertools.count()
        first = len(self.fetched) == 1
        return Fetched(copy, self.fetched[-1], lambda: first and next(asked) >= 1)

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        self.finished.append(outcome)


class WrittenSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[dict[str, Any]] = []

    def write(self, job: Job, markdown: str, document: dict[str, Any], *rest: Any) -> None:
        self.written.append(document)


async def test_a_source_rewritten_after_its_pages_were_read_gets_sidecars_of_its_new_bytes(
    tmp_path: Path,
) -> None:
    """Its content is asked about again right before the outputs are published: the run that read
    the old bytes is tried again as ``source_changed``, and only the new bytes' sidecars are
    written."""
    old = docs.write_pdf(tmp_path / "old.pdf", [["OLD ONE"], ["OLD TWO"]])
    new = docs.write_pdf(tmp_path / "new.pdf", [["NEW"]])
    cfg = Config(
        state_dir=tmp_path / "state",
        engine={"kind": "plugin", "plugin": "tests.support.fault_engines:EchoEngine"},
        retry={"attempts": 3, "backoff_initial_seconds": 0.01, "backoff_max_seconds": 0.01},
    )
    made = Pipeline(cfg, None, Metrics())
    source, sink = RewrittenSource(old, new), WrittenSink()
    made.add_source(source, sink)
    await made.start()
    try:
        job = Job(origin=LocalFile(tmp_path / "doc.pdf", tmp_path), source="local")
        with capture_logs() as logs:
            assert await made.start_job(job, Asked()) == "ok"
    finally:
        await made.close()
    new_sha = hashlib.sha256(new.read_bytes()).hexdigest()
    assert [document["source"]["sha256"] for document in sink.written] == [new_sha]
    assert len(sink.written[0]["pages"]) == 1 and source.fetched[-1] == new_sha
    retries = [e for e in logs if e["event"] == "job_retry"]
    assert [e["kind"] for e in retries] == ["source_changed"]
    assert source.finished == ["done"]


@pytest.mark.parametrize("on_success", ["keep", "move", "delete"])
async def test_a_local_document_is_hashed_once_from_its_admission_to_its_sidecars(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, on_success: str
) -> None:
    """Admission hashes a new file to ask whether it is done; its run copies it, and a move or a
    delete holds it, under the very signature admission hashed it under, so the file is not read
    for its sha256 again, and its sidecar records the sha256 of its bytes all the same."""
    inbox, archive = tmp_path / "inbox", tmp_path / "archive"
    inbox.mkdir()
    archive.mkdir()
    pdf = docs.write_pdf(inbox / "doc.pdf", [["ONE"]])
    sha256, inode = hashlib.sha256(pdf.read_bytes()).hexdigest(), os.stat(pdf).st_ino
    hashed: list[int] = []
    hash_fd = sourcefile.hash_fd

    def counted(fd: int, **options: Any) -> str:
        if os.fstat(fd).st_ino == inode:  # the source's, not a copy's
            hashed.append(fd)
        return hash_fd(fd, **options)

    monkeypatch.setattr(sourcefile, "hash_fd", counted)
    cfg = Config(
        state_dir=tmp_path / "state",
        inbox=[{"path": inbox}],
        output={"on_success": on_success, "archive_dir": archive},
        engine={"kind": "plugin", "plugin": "tests.support.fault_engines:EchoEngine"},
    )
    made = Pipeline(cfg, AsyncLedger(ledger), Metrics())
    template = cfg.output.name_template
    local = LocalSource(cfg.inbox, reconcile_seconds=60.0, name_template=template)
    made.add_source(local, LocalSink(template, cfg.output.dir, cfg.inbox, made.written))
    await made.start()
    try:
        job = Job(origin=LocalFile(pdf, inbox), source="local")
        assert (await made.submit(job)).outcome == "admitted"
        await until(
            lambda: ledger.known(job.key).state == "done" and job.key not in made.running(),
            "the document done, and its run ended",
        )
    finally:
        await made.close()
    sidecar = inbox / "doc.pdf.json" if on_success != "move" else archive / "inbox" / "doc.pdf.json"
    assert json.loads(sidecar.read_text())["source"]["sha256"] == sha256
    assert pdf.exists() is (on_success == "keep"), "moved or deleted as configured"
    assert len(hashed) == 1, "hashed by admission, then again by its run or its move"
