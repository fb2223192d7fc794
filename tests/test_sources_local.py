"""LocalSource on real folders, watched by real watchdog observers, driven by a real asyncio loop.

Waits are polling loops with deadlines. A claim that something is *not* taken waits for a sentinel
written after it to be taken, then a short grace period: the only fixed sleeps are those grace
periods and the pauses of deliberately slow writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import structlog
from PIL import Image

from ocrwatch.config import InboxConfig
from ocrwatch.errors import ConfigError, NotARegularFile, OcrwatchError, SourceGone
from ocrwatch.jobs import quarantine as quarantining
from ocrwatch.sources import local, settling, watch
from ocrwatch.sources.base import Answer, Job, LocalFile, Quarantine
from ocrwatch.sources.local import LocalSource
from ocrwatch.sources.readiness import probe
from ocrwatch.sources.watch import choose_polling, filesystem_type
from tests.support.outboxes import fed

SETTLE = 0.2
PAUSE = 6 * SETTLE  # a writer's pause: long enough for the file to look settled, though incomplete
# how long to wait, after a sentinel is taken, before saying something else was not
GRACE = 3 * SETTLE


def pdf_bytes(pages: int = 3) -> bytes:
    buffer = io.BytesIO()
    first, *rest = (
        Image.new("RGB", (300, 200), shade) for shade in ("white", "gray", "black")[:pages]
    )
    first.save(buffer, "PDF", save_all=True, append_images=rest)
    return buffer.getvalue()


def image_bytes(kind: str, frames: int = 1) -> bytes:
    buffer = io.BytesIO()
    first, *rest = (Image.new("RGB", (200, 120), (40 * index, 90, 200)) for index in range(frames))
    options: dict[str, Any] = {"save_all": True, "append_images": rest} if frames > 1 else {}
    first.save(buffer, kind, **options)
    return buffer.getvalue()


PDF = pdf_bytes()


def inbox(path: Path, **overrides: Any) -> InboxConfig:
    return InboxConfig(path=path, settle_seconds=SETTLE, **overrides)


class Collector:
    """The daemon's ``submit``: records each job with the file's size at the moment it was
    submitted."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.sizes: list[int] = []

    async def __call__(self, job: Job) -> None:
        self.jobs.append(job)
        self.sizes.append(os.stat(job.origin.path).st_size)

    def paths(self) -> list[Path]:
        return [job.origin.path for job in self.jobs if isinstance(job.origin, LocalFile)]

    def names(self) -> set[str]:
        return {path.name for path in self.paths()}


async def never_reject(job: Job, error: OcrwatchError, attempts: int) -> None:
    raise AssertionError(f"the local source gave up {job.key} unprocessed: {error}")


async def until(predicate: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching(
    *inboxes: InboxConfig,
    reconcile_seconds: float = 60.0,
    lapsed: Callable[[Job], bool] = lambda job: False,
    collector: Collector | None = None,
    set_aside: list[Quarantine] | None = None,
) -> AsyncIterator[tuple[LocalSource, Collector]]:
    collector = collector or Collector()
    source = LocalSource(inboxes, reconcile_seconds=reconcile_seconds, name_template="{name}")
    await source.start(fed(collector, never_reject, lapsed, set_aside))
    try:
        yield source, collector
    finally:
        await source.stop()


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 30))


# --- readiness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
@pytest.mark.parametrize("writer", ["pauses", "closes-and-reopens"])
def test_slow_writer_is_taken_once_and_only_when_complete(
    tmp_path: Path, writer: str, polling: bool
) -> None:
    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in", polling=polling)) as (_, got):
            target = (tmp_path / "in").resolve() / "slow.pdf"
            handle = open(target, "wb")  # noqa: SIM115 - a writer mid-file across the awaits
            handle.write(PDF[: len(PDF) // 2])
            handle.flush()
            if writer == "closes-and-reopens":
                handle.close()  # a close is no proof: the writer comes back
            await asyncio.sleep(PAUSE)
            assert got.jobs == [], "taken while half written"
            if writer == "closes-and-reopens":
                handle = open(target, "ab")  # noqa: SIM115 - as above
            handle.write(PDF[len(PDF) // 2 :])
            handle.close()
            await until(lambda: got.jobs, "the completed file")
            await asyncio.sleep(GRACE)
            assert got.paths() == [target]
            assert got.sizes == [len(PDF)]

    run(scenario())


def test_a_burst_of_files_settles_without_a_task_per_file(tmp_path: Path) -> None:
    """Files waiting to settle wait in one heap of deadlines, not as a task (and an Event) each: a
    backlog dropped at once cost about 1.5 KB a file that way. Each is still taken once, when
    due."""
    files = 300
    folder = tmp_path / "in"
    folder.mkdir()
    for number in range(files):
        (folder / f"page-{number:03d}.pdf").write_bytes(PDF)

    async def scenario() -> None:
        async with watching(InboxConfig(path=folder, settle_seconds=1.0)) as (_, got):
            tasks = len(asyncio.all_tasks())
            # SETTLE_STEPS (32) files looked at, the source's few own tasks, the test's
            assert tasks <= 50, f"{tasks} tasks for {files} files settling"
            await until(lambda: len(got.jobs) >= files, "every file", timeout=20)
            await asyncio.sleep(GRACE)
            assert sorted(got.names()) == sorted(
                f"page-{number:03d}.pdf" for number in range(files)
            )
            assert len(got.jobs) == files

    run(scenario())


def test_stable_file_that_never_passes_the_probe_is_submitted_in_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settling, "PROBE_GIVE_UP_SETTLES", 2)
    monkeypatch.setattr(settling, "PROBE_GIVE_UP_MIN_SECONDS", 1.0)

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in")) as (_, got):
            loop = asyncio.get_running_loop()
            written = loop.time()
            (tmp_path / "in" / "truncated.pdf").write_bytes(PDF[:-200])
            await until(lambda: got.jobs, "the truncated file")
            assert loop.time() - written >= 1.0, "a truncated PDF must wait for the give-up delay"
            assert got.names() == {"truncated.pdf"}  # the renderer reports corrupt_pdf

    run(scenario())


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
def test_an_empty_file_closed_is_submitted_once_quiet_without_the_probes_give_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polling: bool
) -> None:
    """A close with nothing written is decided after settle_seconds (the pipeline fails it as
    empty_file), not after the give-up, an hour here; where no close is seen (polling), an empty
    file waits for the give-up, since its writer may hold it open; a writer that closes and comes
    back within settle_seconds is waited for."""
    monkeypatch.setattr(settling, "PROBE_GIVE_UP_MIN_SECONDS", 3600.0)

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in", polling=polling)) as (_, got):
            folder = (tmp_path / "in").resolve()
            (folder / "empty.pdf").write_bytes(b"")
            reopened = folder / "reopened.pdf"
            reopened.write_bytes(b"")  # created and closed, then opened again to write
            await asyncio.sleep(SETTLE / 4)
            with open(reopened, "r+b") as handle:
                handle.write(PDF)
            (folder / "sentinel.pdf").write_bytes(PDF)
            await until(lambda: {"sentinel.pdf", "reopened.pdf"} <= got.names(), "the whole files")
            if polling:
                await asyncio.sleep(GRACE)
                assert "empty.pdf" not in got.names()
            else:
                await until(lambda: "empty.pdf" in got.names(), "the empty file")
            await asyncio.sleep(GRACE)
            taken = [(job.origin.name, size) for job, size in zip(got.jobs, got.sizes, strict=True)]
            expected = {"sentinel.pdf": len(PDF), "reopened.pdf": len(PDF)} | (
                {} if polling else {"empty.pdf": 0}
            )
            assert len(taken) == len(expected) and dict(taken) == expected, taken

    run(scenario())


def test_an_empty_file_found_untouched_for_the_give_up_is_submitted_once_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No close is seen of a file already there (a restart's scan, a polled inbox): an empty one
    that nothing has changed (its ctime) for the give-up has waited for it already."""
    give_up = 2.0
    monkeypatch.setattr(settling, "PROBE_GIVE_UP_MIN_SECONDS", give_up)
    folder = (tmp_path / "in").resolve()
    folder.mkdir()
    (folder / "empty.pdf").write_bytes(b"")
    (folder / "young.pdf").write_bytes(b"")

    async def scenario() -> None:
        await asyncio.sleep(give_up)
        os.utime(folder / "young.pdf")  # its ctime now: its writer may still be about to write
        async with watching(inbox(folder, polling=True)) as (_, got):
            started = asyncio.get_running_loop().time()
            await until(lambda: got.jobs, "the empty file")
            assert asyncio.get_running_loop().time() - started < give_up, (
                "waited for the give-up again"
            )
            assert got.names() == {"empty.pdf"}
            await until(lambda: len(got.jobs) == 2, "the young one, after the give-up")

    run(scenario())


def test_unchanged_file_is_not_resubmitted_by_reconciliation_but_a_changed_one_is(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in"), reconcile_seconds=0.3) as (_, got):
            target = tmp_path / "in" / "doc.pdf"
            target.write_bytes(PDF)
            await until(lambda: got.jobs, "the file")
            await asyncio.sleep(1.0)  # three reconciliation scans
            assert len(got.jobs) == 1
            target.write_bytes(pdf_bytes(pages=1))
            await until(lambda: len(got.jobs) == 2, "the changed file")
            assert got.sizes[1] == target.stat().st_size

    run(scenario())


def test_a_document_failed_for_its_path_only_is_submitted_again_once_a_scan_finds_it_whole(
    tmp_path: Path,
) -> None:
    """A run that met its folder swapped for a link fails ``source_gone`` and leaves no error
    sidecar: the file, whole at its path again, is submitted by the next scan; one failed for its
    bytes is not."""

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in"), reconcile_seconds=0.3) as (source, got):
            (tmp_path / "in" / "gone.pdf").write_bytes(PDF)
            (tmp_path / "in" / "bad.pdf").write_bytes(PDF)
            await until(lambda: got.names() == {"gone.pdf", "bad.pdf"}, "both files")
            jobs = {
                job.origin.path.name: job for job in got.jobs if isinstance(job.origin, LocalFile)
            }
            await source.finish(jobs["bad.pdf"], "failed", "corrupt_pdf")
            await source.finish(jobs["gone.pdf"], "failed", "source_gone")
            await until(lambda: len(got.jobs) == 3, "gone.pdf submitted again")
            await asyncio.sleep(1.0)  # three reconciliation scans
            assert sorted(path.name for path in got.paths()) == ["bad.pdf", "gone.pdf", "gone.pdf"]

    run(scenario())


class NotThereOnce(Collector):
    """A ``submit`` that finds the first file not there to read, as admission does when a folder on
    its path is swapped for a link at that moment, and answers so."""

    def __init__(self) -> None:
        super().__init__()
        self.source: LocalSource | None = None
        self.answered = 0

    async def __call__(self, job: Job) -> Answer | None:
        await super().__call__(job)
        if self.answered == 0 and self.source is not None:
            self.answered += 1
            return Answer("retry")
        return None


def test_a_document_not_admitted_for_what_its_path_was_is_submitted_again_by_the_next_scan(
    tmp_path: Path,
) -> None:
    """``retry`` answered by ``submit``: the source does not hold the file as handed
    over (else no scan would look at it again, and it would end with no outcome at all)."""

    async def scenario() -> None:
        got = NotThereOnce()
        async with watching(inbox(tmp_path / "in"), reconcile_seconds=0.3, collector=got) as (
            source,
            _,
        ):
            got.source = source
            (tmp_path / "in" / "doc.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 2, "doc.pdf submitted again")
            await asyncio.sleep(1.0)  # three reconciliation scans: handed over now, it stays so
            assert [path.name for path in got.paths()] == ["doc.pdf", "doc.pdf"]

    run(scenario())


class Lapsed:
    """The daemon's ``lapsed``: a document is done once submitted, and its sidecars lapse when its
    JSON sidecar (beside it, or in ``out``) is gone. Records what it was asked."""

    def __init__(self, out: Path | None = None) -> None:
        self.out = out
        self.asked: list[str] = []

    def __call__(self, job: Job) -> bool:
        assert isinstance(job.origin, LocalFile)
        self.asked.append(job.origin.name)
        return not ((self.out or job.origin.path.parent) / f"{job.origin.name}.json").exists()


def test_a_sidecar_deleted_or_moved_away_beside_its_document_has_it_submitted_again_at_once(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        lapsed = Lapsed()
        # no reconciliation meanwhile
        async with watching(inbox(tmp_path / "in"), lapsed=lapsed) as (_, got):
            folder = (tmp_path / "in").resolve()
            for name in ("a.pdf", "b.pdf"):
                (folder / name).write_bytes(PDF)
            await until(lambda: len(got.jobs) == 2, "both files")
            for name in ("a.pdf", "b.pdf"):  # what the sink writes
                (folder / f"{name}.md").write_text("<!-- page 1 -->\n")
                (folder / f"{name}.json").write_text("{}")
            await asyncio.sleep(GRACE)
            assert len(got.jobs) == 2, "a sidecar written made its document be taken again"
            (folder / "a.pdf.json").unlink()
            await until(lambda: len(got.jobs) == 3, "the document whose sidecar was deleted")
            (folder / "b.pdf.json").rename(tmp_path / "elsewhere.json")
            await until(lambda: len(got.jobs) == 4, "the document whose sidecar was moved away")
            (folder / "b.pdf.json").write_text("{}")  # written again
            (folder / "b.pdf.md").unlink()  # asked, but its JSON is there: not lapsed
            await asyncio.sleep(GRACE)
            assert got.names() == {"a.pdf", "b.pdf"} and len(got.jobs) == 4
            # the JSON written, moved away, the Markdown deleted
            assert lapsed.asked.count("b.pdf") >= 3

    run(scenario())


def test_reconciliation_submits_again_only_documents_whose_sidecars_lapsed(tmp_path: Path) -> None:
    """Sidecars under ``[output] dir`` raise no event in the inbox: the periodic scan asks for every
    document it submitted before and finds unchanged, and submits again only those whose sidecars
    lapsed."""
    out = tmp_path / "out"
    out.mkdir()

    async def scenario() -> None:
        lapsed = Lapsed(out)
        async with watching(inbox(tmp_path / "in"), reconcile_seconds=0.3, lapsed=lapsed) as (
            _,
            got,
        ):
            for name in ("kept.pdf", "lost.pdf"):
                (tmp_path / "in" / name).write_bytes(PDF)
                (out / f"{name}.json").write_text("{}")
            await until(lambda: len(got.jobs) == 2, "both files")
            await until(
                lambda: lapsed.asked.count("kept.pdf") >= 2, "two scans asking for each document"
            )
            assert len(got.jobs) == 2
            (out / "lost.pdf.json").unlink()
            await until(lambda: len(got.jobs) == 3, "the document whose sidecar was deleted")
            assert got.jobs[2].origin.name == "lost.pdf"
            (out / "lost.pdf.json").write_text("{}")  # written again
            asked = len(lapsed.asked)
            await until(
                lambda: len(lapsed.asked) >= asked + 4, "two scans: one that asked before is over"
            )
            submitted, asked = len(got.jobs), len(lapsed.asked)
            await until(lambda: len(lapsed.asked) >= asked + 4, "two more scans")
            assert len(got.jobs) == submitted
            assert [job.origin.name for job in got.jobs].count("kept.pdf") == 1

    run(scenario())


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow, reading the partial TIFF
def test_probe_knows_whole_files_from_partial_ones(tmp_path: Path) -> None:
    samples = {
        "pdf": PDF,
        "png": image_bytes("PNG"),
        "jpeg": image_bytes("JPEG"),
        "tiff": image_bytes("TIFF", frames=3),
        "webp": image_bytes("WEBP"),
    }
    for kind, data in samples.items():
        whole, partial = tmp_path / f"whole.{kind}", tmp_path / f"partial.{kind}"
        whole.write_bytes(data)
        partial.write_bytes(data[: len(data) * 2 // 3])
        assert probe(whole, tmp_path), kind
        assert not probe(partial, tmp_path), kind
    (tmp_path / "notes.pdf").write_bytes(b"plain text that merely ends in .pdf\n")
    assert probe(tmp_path / "notes.pdf", tmp_path), (
        "unknown content is submitted so the renderer says not_a_document"
    )
    (tmp_path / "empty.pdf").write_bytes(b"")
    (tmp_path / "tiny.pdf").write_bytes(b"%PD")
    assert not probe(tmp_path / "empty.pdf", tmp_path) and not probe(
        tmp_path / "tiny.pdf", tmp_path
    )
    os.mkfifo(tmp_path / "fifo.pdf")
    assert not probe(tmp_path / "fifo.pdf", tmp_path)  # returns at once: never blocks on a FIFO
    (tmp_path / "link.pdf").symlink_to(whole.with_suffix(".pdf"))
    assert not probe(tmp_path / "link.pdf", tmp_path), (
        "a link is never opened, even to a whole file"
    )


# --- arrival --------------------------------------------------------------------------------------


def test_files_and_folders_moved_in_are_taken(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "batch" / "deeper").mkdir(parents=True)
    (outside / "moved.pdf").write_bytes(PDF)
    (outside / "batch" / "one.pdf").write_bytes(PDF)
    (outside / "batch" / "deeper" / "two.png").write_bytes(image_bytes("PNG"))

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in")) as (_, got):
            root = (tmp_path / "in").resolve()
            os.rename(outside / "moved.pdf", root / "moved.pdf")
            os.rename(outside / "batch", root / "batch")
            await until(lambda: len(got.jobs) == 3, "three moved-in files")
            await asyncio.sleep(GRACE)
            assert sorted(got.paths()) == sorted(
                [
                    root / "moved.pdf",
                    root / "batch" / "one.pdf",
                    root / "batch" / "deeper" / "two.png",
                ]
            )

    run(scenario())


def test_recursive_inbox_takes_nested_folders_and_flat_inbox_ignores_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        deep, flat = tmp_path / "deep", tmp_path / "flat"
        async with watching(inbox(deep), inbox(flat, recursive=False)) as (_, got):
            (deep / "a" / "b").mkdir(parents=True)
            (deep / "a" / "b" / "nested.pdf").write_bytes(PDF)
            (flat / "sub").mkdir()
            (flat / "sub" / "ignored.pdf").write_bytes(PDF)
            (flat / "top.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 2, "nested.pdf and top.pdf")
            await asyncio.sleep(GRACE)
            assert sorted(got.paths()) == [
                deep.resolve() / "a" / "b" / "nested.pdf",
                flat.resolve() / "top.pdf",
            ]
            assert got.jobs[0].origin.inbox in (deep.resolve(), flat.resolve())

    run(scenario())


def test_names_with_spaces_non_ascii_and_upper_case(tmp_path: Path) -> None:
    names = ["rapport annuel été 2024.pdf", "日本語 スキャン.png", "SCAN 0001.PDF"]

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in", priority=80, prompt="free", max_pages=7)) as (
            _,
            got,
        ):
            for name in names:
                data = image_bytes("PNG") if name.endswith(".png") else PDF
                (tmp_path / "in" / name).write_bytes(data)
            await until(lambda: len(got.jobs) == 3, "three files")
            assert got.names() == set(names)
            job = got.jobs[0]
            settings = (job.source, job.priority, job.prompt, job.max_pages, job.max_bytes)
            assert settings == ("local", 80, "free", 7, None)
            assert job.key == job.origin.path.as_uri()

    run(scenario())


def test_files_present_before_start_are_found_by_the_startup_scan(tmp_path: Path) -> None:
    root = tmp_path / "in"
    (root / "old" / "er").mkdir(parents=True)
    (root / "before.pdf").write_bytes(PDF)
    (root / "old" / "er" / "image.png").write_bytes(image_bytes("PNG"))
    (root / "before.pdf.md").write_text("# a sidecar from an earlier run\n")

    async def scenario() -> None:
        async with watching(inbox(root)) as (_, got):
            await until(lambda: len(got.jobs) == 2, "both files")
            await asyncio.sleep(GRACE)
            assert got.names() == {"before.pdf", "image.png"}

    run(scenario())


# --- what is refused ------------------------------------------------------------------------------


def test_temporaries_sidecars_and_hidden_files_are_ignored(tmp_path: Path) -> None:
    ignored = [
        "copy.pdf.part",
        "copy.pdf.tmp",
        "copy.pdf.crdownload",
        "UPPER.PDF.PART",
        "~$locked.pdf",
        ".hidden.pdf",
        "report.pdf.md",
        "report.pdf.json",
        "report.pdf.error.json",
        ".report.pdf.json.ocrwatch-tmp-1a2b",
    ]

    async def scenario() -> None:
        root = tmp_path / "in"
        async with watching(inbox(root, patterns=("*",))) as (_, got):
            (root / ".sync").mkdir()
            (root / ".sync" / "inside-dot-dir.pdf").write_bytes(PDF)
            for name in ignored:
                (root / name).write_bytes(PDF)
            (root / "report.pdf").write_bytes(PDF)
            with open(root / "renamed.pdf.part", "wb") as part:
                part.write(PDF)
            os.rename(root / "renamed.pdf.part", root / "renamed.pdf")
            await until(lambda: len(got.jobs) == 2, "report.pdf and renamed.pdf")
            await asyncio.sleep(GRACE)
            assert got.names() == {"report.pdf", "renamed.pdf"}

    run(scenario())


def test_directories_and_fifos_named_like_documents_are_ignored_without_blocking(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    os.mkfifo(root / "early-fifo.pdf")

    async def scenario() -> None:
        async with watching(inbox(root)) as (source, got):
            (root / "folder.pdf").mkdir()
            os.mkfifo(root / "late-fifo.pdf")
            (root / "folder.pdf" / "inside.pdf").write_bytes(PDF)
            (root / "good.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 2, "good.pdf and folder.pdf/inside.pdf")
            await asyncio.sleep(GRACE)
            assert got.names() == {"good.pdf", "inside.pdf"}
            fifo_job = Job(
                origin=LocalFile(root.resolve() / "late-fifo.pdf", root.resolve()), source="local"
            )
            with pytest.raises(NotARegularFile):
                await source.fetch(fifo_job, tmp_path)

    run(scenario())


@pytest.mark.parametrize("polling", [False, True], ids=["native", "polling"])
@pytest.mark.parametrize("when", ["before start", "while watching"])
def test_no_link_is_followed_and_each_is_refused_once(
    tmp_path: Path, polling: bool, when: str
) -> None:
    """Choice: a link is never a document and never a way in, whether it leads out of the inbox or
    within it, to a file or to a folder (``ln -s . a; ln -s .. b`` must not make either watcher walk
    for ever). The native and the polling watcher treat them alike: one ``local_refused`` line
    each."""
    root = tmp_path / "in"
    (root / ".private").mkdir(parents=True)
    (tmp_path / "elsewhere.pdf").write_bytes(PDF)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "beyond.pdf").write_bytes(PDF)
    links = {
        "passwd.pdf": Path("/etc/passwd"),
        "escape.pdf": tmp_path / "elsewhere.pdf",
        "peek.pdf": root / ".private" / "secret.pdf",
        "alias.pdf": Path("real.pdf"),
        "a": Path("."),
        "b": Path(".."),
        "out": tmp_path / "folder",
    }

    def make_links() -> None:
        (root / ".private" / "secret.pdf").write_bytes(PDF)
        (root / "real.pdf").write_bytes(PDF)
        for name, target in links.items():
            (root / name).symlink_to(target)

    if when == "before start":
        make_links()

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            async with watching(inbox(root, polling=polling)) as (_, got):
                if when == "while watching":
                    make_links()
                await until(lambda: got.names() == {"real.pdf"}, "real.pdf")
                await until(
                    lambda: (
                        {Path(e["path"]).name for e in logs if e["event"] == "local_refused"}
                        >= set(links)
                    ),
                    "every link refused",
                )
                (root / "sentinel.pdf").write_bytes(PDF)
                await until(lambda: len(got.jobs) == 2, "sentinel.pdf")
                await asyncio.sleep(GRACE)
                assert sorted(got.paths()) == [
                    root.resolve() / "real.pdf",
                    root.resolve() / "sentinel.pdf",
                ]
        refused = [entry for entry in logs if entry["event"] == "local_refused"]
        assert sorted(Path(entry["path"]).name for entry in refused) == sorted(links), (
            "one line per link"
        )
        reasons = {Path(entry["path"]).name: entry["reason"] for entry in refused}
        assert "outside the inbox" in reasons["passwd.pdf"] and "outside the inbox" in reasons["b"]
        assert all("links are not followed" in reason for reason in reasons.values())

    run(scenario())


# --- observers, scans, reloads --------------------------------------------------------------------


def test_filesystem_type_from_mountinfo() -> None:
    mountinfo = "\n".join(
        [
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
            "40 22 0:35 / /srv/nfs rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2",
            "42 40 0:37 / /srv/nfs/local rw - tmpfs tmpfs rw",
            r"41 22 0:36 / /mnt/my\040share rw master:3 - cifs //host/share rw",
            "43 22 0:38 / /home/u/remote rw,nosuid,nodev shared:9 master:2 - fuse.sshfs u@h:/ rw",
            "44 22 0:39 / /data rw - xfs /dev/sdb rw",
            "45 22 0:40 / /data rw - nfs nas:/data rw",
            "garbage line",
        ]
    )
    assert filesystem_type(Path("/srv/nfs/inbox/a"), mountinfo) == "nfs4"
    assert filesystem_type(Path("/srv/nfs/local/inbox"), mountinfo) == "tmpfs"
    assert filesystem_type(Path("/srv/nfsish/inbox"), mountinfo) == "ext4"  # whole components only
    assert filesystem_type(Path("/mnt/my share/inbox"), mountinfo) == "cifs"
    assert filesystem_type(Path("/home/u/remote/scans"), mountinfo) == "fuse.sshfs"
    # mounted over xfs: the last mount wins
    assert filesystem_type(Path("/data"), mountinfo) == "nfs"
    assert filesystem_type(Path("/anything"), "") is None

    assert choose_polling("auto", "nfs4")[0] and choose_polling("auto", "fuse.sshfs")[0]
    assert choose_polling("auto", "cifs") == (True, "cifs cannot push events")
    assert choose_polling("auto", "ext4") == (False, "ext4 pushes events")
    assert choose_polling("auto", None) == (False, "mount type unknown")
    assert choose_polling(True, "ext4") == (True, "configured polling = true")
    assert choose_polling(False, "nfs") == (False, "configured polling = false")
    real = Path("/proc/self/mountinfo")
    if real.exists():
        assert filesystem_type(Path.cwd().resolve(), real.read_text()) is not None


def test_observer_choice_is_logged_and_polling_mode_takes_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            async with watching(
                inbox(tmp_path / "polled", polling=True), inbox(tmp_path / "native")
            ) as (_, got):
                (tmp_path / "polled" / "a.pdf").write_bytes(PDF)
                (tmp_path / "native" / "b.pdf").write_bytes(PDF)
                await until(lambda: len(got.jobs) == 2, "a file in each inbox")
        watching_logs = {Path(e["path"]).name: e for e in logs if e["event"] == "inbox_watching"}
        assert watching_logs["polled"]["observer"] == "polling"
        assert watching_logs["polled"]["reason"] == "configured polling = true"
        fstype = filesystem_type(tmp_path.resolve(), Path("/proc/self/mountinfo").read_text())
        polling, reason = choose_polling("auto", fstype)
        assert watching_logs["native"]["observer"] == ("polling" if polling else "native")
        assert watching_logs["native"]["reason"] == reason

    run(scenario())


def test_reconciliation_finds_a_file_whose_events_were_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection at the one seam events pass through: every event about ``lost.pdf`` is
    dropped, as an inotify queue overflow or a restart of the observer would; only the periodic scan
    can find it."""
    dropped: list[object] = []

    class LosingBridge(watch.EventBridge):
        def dispatch(self, event: Any) -> None:
            if "lost" in os.fsdecode(event.src_path) + os.fsdecode(event.dest_path):
                dropped.append(event)
            else:
                super().dispatch(event)

    monkeypatch.setattr(local, "EventBridge", LosingBridge)

    async def scenario() -> None:
        async with watching(inbox(tmp_path / "in"), reconcile_seconds=1.5) as (_, got):
            (tmp_path / "in" / "lost.pdf").write_bytes(PDF)
            (tmp_path / "in" / "seen.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 2, "both files")
            assert dropped, "the fault was not injected"
            assert [path.name for path in got.paths()] == ["seen.pdf", "lost.pdf"]

    run(scenario())


def test_update_inboxes_adds_and_removes_without_dropping_pending_work(tmp_path: Path) -> None:
    first, second = inbox(tmp_path / "first"), inbox(tmp_path / "second", priority=90)

    async def scenario() -> None:
        async with watching(first) as (source, got):
            slow = open(tmp_path / "first" / "slow.pdf", "wb")  # noqa: SIM115 - a writer mid-file
            slow.write(PDF[:1000])
            slow.flush()
            await asyncio.sleep(SETTLE)
            await source.update_inboxes([first, second])  # second is created: create = true
            (tmp_path / "second" / "new.pdf").write_bytes(PDF)
            await until(lambda: got.names() == {"new.pdf"}, "new.pdf in the added inbox")
            assert got.jobs[0].priority == 90
            slow.write(PDF[1000:])
            slow.close()
            await until(
                lambda: len(got.jobs) == 2, "slow.pdf, which was settling during the reload"
            )
            with pytest.raises(ConfigError):
                await source.update_inboxes([second, inbox(tmp_path / "second")])
            await source.update_inboxes([second])
            (tmp_path / "first" / "after-removal.pdf").write_bytes(PDF)
            (tmp_path / "second" / "sentinel.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 3, "sentinel.pdf")
            await asyncio.sleep(GRACE)
            assert [path.name for path in got.paths()] == ["new.pdf", "slow.pdf", "sentinel.pdf"]

    run(scenario())


# --- fetch and finish -----------------------------------------------------------------------------


async def failed(source: LocalSource, job: Job, kind: str | None) -> dict[str, str] | None:
    """``finish`` for a failure, the quarantine it asks for carried out as the layer above does it
    (with no record of outputs: no error sidecar is ocrwatch's)."""
    asked = await source.finish(job, "failed", kind)
    return None if asked is None else await quarantining.quarantine(asked, None)


def test_fetch_checks_the_file_and_a_failure_is_quarantined_without_overwriting(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    quarantine = root / "failed"
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)

    async def scenario() -> None:
        async with watching(inbox(root, quarantine_dir=quarantine)) as (source, got):
            (root / "sub").mkdir()
            (root / "sub" / "bad.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 1, "bad.pdf")
            job = got.jobs[0]
            fetched = await source.fetch(job, spool)
            assert fetched.path.parent == spool and fetched.path.read_bytes() == PDF
            assert fetched.sha256 == hashlib.sha256(PDF).hexdigest() and not fetched.changed()
            fetched.path.unlink()
            (root / "sub" / "bad.pdf.error.json").write_text('{"kind": "corrupt_pdf"}')
            await source.finish(job, "done")
            for kind in ("output_conflict", "source_gone", "crash_loop", "no_such_kind", None):
                # faults fixed beside it: it stays for its hint
                assert await source.finish(job, "failed", kind) is None, kind

            moved = await failed(source, job, "corrupt_pdf")
            assert moved == {"source": (quarantine / "sub" / "bad.pdf").as_uri()}
            assert not (root / "sub" / "bad.pdf").exists()
            assert (quarantine / "sub" / "bad.pdf").read_bytes() == PDF
            # Written by the test, so no record of outputs holds it as ocrwatch's: it stays
            # (tests/test_archive.py has the quarantine take a recorded one along).
            assert (root / "sub" / "bad.pdf.error.json").exists()
            with pytest.raises(SourceGone):
                await source.fetch(job, spool)

            other = pdf_bytes(pages=1)
            (root / "sub" / "bad.pdf").write_bytes(other)
            await until(lambda: len(got.jobs) == 2, "the second bad.pdf")
            await failed(source, got.jobs[1], "corrupt_pdf")
            assert (quarantine / "sub" / "bad.1.pdf").read_bytes() == other
            assert (quarantine / "sub" / "bad.pdf").read_bytes() == PDF  # not overwritten

            with open(root / "sub" / "bad.pdf", "wb") as fixed:  # a fixed version arrives meanwhile
                fixed.write(PDF[:1000])
                fixed.flush()
                await asyncio.sleep(SETTLE)
                # late news about the old version
                assert await source.finish(got.jobs[1], "failed", "corrupt_pdf") is None
                assert (root / "sub" / "bad.pdf").exists(), (
                    "a version being written is never quarantined"
                )
                fixed.write(PDF[1000:])
            await until(lambda: len(got.jobs) == 3, "the fixed bad.pdf")

            (root / "sub" / "bad.pdf").unlink()
            (root / "sub" / "bad.pdf").mkdir()
            with pytest.raises(NotARegularFile):
                await source.fetch(job, spool)
            (root / "sentinel.pdf").write_bytes(PDF)
            await until(lambda: len(got.jobs) == 4, "sentinel.pdf")
            await asyncio.sleep(GRACE)
            assert got.names() == {"bad.pdf", "sentinel.pdf"}, (
                "quarantined files are not taken again"
            )

    run(scenario())


def test_a_document_that_failed_before_is_set_aside_when_a_scan_finds_it(tmp_path: Path) -> None:
    """A document the ledger holds as failed for its own bytes, found again by a scan (a restart, a
    quarantine_dir set since, a move that failed before), is set aside as a run's failure is: the
    source asks the layer above through its outbox. It was kept in place, logged as "a new version
    is being written" (its version was not yet the one recorded as settled)."""
    root, moves = tmp_path / "in", []
    (root).mkdir()
    (root / "bad.pdf").write_bytes(PDF)
    (root / "kept.pdf").write_bytes(PDF)

    class FailedBefore(Collector):
        async def __call__(self, job: Job) -> Answer | None:  # type: ignore[override]
            await super().__call__(job)
            kind = "corrupt_pdf" if job.origin.path.name == "bad.pdf" else "output_conflict"
            return Answer("failed", kind)

    async def scenario() -> None:
        config = inbox(root, quarantine_dir=tmp_path / "quarantine")
        async with watching(config, collector=FailedBefore(), set_aside=moves) as (_, got):
            await until(lambda: len(got.jobs) == 2 and moves, "the move asked")
            await asyncio.sleep(GRACE)
        assert [(m.path, m.root, m.to) for m in moves] == [
            (root / "bad.pdf", root, tmp_path / "quarantine")
        ]  # output_conflict is no fault of the document's own: it stays for its hint's fix

    run(scenario())


def test_quarantine_follows_no_link_on_either_side(tmp_path: Path) -> None:
    """A folder of the quarantine made a link in advance, or the document's folder swapped for a
    link to a folder outside with a file of the same name: the move is refused and nothing outside
    is touched."""
    root, outside = tmp_path / "in", tmp_path / "outside"
    quarantine = root / "failed"
    (quarantine).mkdir(parents=True)
    (outside / "trap").mkdir(parents=True)
    (quarantine / "sub").symlink_to(outside / "trap")
    (outside / "theirs").mkdir()
    (outside / "theirs" / "doc.pdf").write_bytes(b"someone else's file")

    async def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            async with watching(inbox(root, quarantine_dir=quarantine)) as (source, got):
                (root / "sub").mkdir()
                (root / "sub" / "bad.pdf").write_bytes(PDF)
                (root / "other").mkdir()
                (root / "other" / "doc.pdf").write_bytes(PDF)
                await until(lambda: len(got.jobs) == 2, "both documents")
                bad, doc = sorted(got.jobs, key=lambda job: job.origin.path.name)
                await failed(source, bad, "not_a_document")
                assert (root / "sub" / "bad.pdf").read_bytes() == PDF, (
                    "moved through the quarantine's link"
                )
                os.rename(root / "other", tmp_path / "gone")
                (root / "other").symlink_to(outside / "theirs")
                await failed(source, doc, "not_a_document")
        assert list((outside / "trap").iterdir()) == []
        assert (outside / "theirs" / "doc.pdf").read_bytes() == b"someone else's file"
        assert not (quarantine / "other").exists()
        failures = [entry for entry in logs if entry["event"] == "local_quarantine_failed"]
        assert [Path(entry["path"]).name for entry in failures] == ["bad.pdf", "doc.pdf"]

    run(scenario())
