"""The error hierarchy: which failures are the document's, which the place's, and how raw errors map
onto it."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from ocrwatch import errors
from ocrwatch.errors import classify


@pytest.mark.parametrize(
    "kind", [errors.DiskFull, errors.OutputNotWritable, errors.StorageUnavailable]
)
def test_faults_of_the_place_are_retried_never_permanent(kind: type[errors.OcrwatchError]) -> None:
    error = kind("x")
    assert isinstance(error, errors.PlaceFault) and error.retryable
    assert "retries" in error.hint and "ocrwatch retry" not in error.hint


@pytest.mark.parametrize("kind", [errors.OutputConflict, errors.NameTooLong])
def test_what_needs_the_user_is_permanent(kind: type[errors.OcrwatchError]) -> None:
    error = kind("x")
    assert isinstance(error, errors.PermanentError) and not error.retryable
    assert not isinstance(error, errors.PlaceFault)


OWN_FAULTS = {
    "empty_file",
    "not_a_document",
    "encrypted_pdf",
    "corrupt_pdf",
    "corrupt_image",
    "no_pages",
}
"""The failures whose cure is a new file: the only ones an inbox's ``quarantine_dir`` takes."""


def test_only_a_fault_of_the_documents_own_bytes_is_quarantined() -> None:
    import ocrwatch.jobs.hooks
    import ocrwatch.sources.s3  # noqa: F401 - their kinds registered too

    kinds = errors._KINDS
    assert {kind for kind, cls in kinds.items() if cls.quarantined} == OWN_FAULTS
    assert all(issubclass(kinds[kind], errors.PermanentError) for kind in OWN_FAULTS)
    for kind, cls in kinds.items():  # a hint that sends the user to fix it in place keeps it there
        if "ocrwatch retry" in cls.hint or "[" in cls.hint or cls.retryable:
            assert not errors.quarantined(kind), kind
    assert errors.quarantined("corrupt_pdf") and errors.CorruptPdf("x").quarantined
    fixed_in_place = (
        "output_conflict",
        "crash_loop",
        "source_gone",
        "too_many_pages",
        "internal_error",
    )
    assert not any(errors.quarantined(kind) for kind in fixed_in_place)
    assert not errors.quarantined(None) and not errors.quarantined("a_kind_of_a_later_version")


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.ENOSPC, "disk_full"),
        (errno.EDQUOT, "disk_full"),
        (errno.EROFS, "output_not_writable"),
        (errno.EACCES, "output_not_writable"),
        (errno.ENAMETOOLONG, "name_too_long"),
    ],
)
def test_os_errors(code: int, kind: str) -> None:
    assert classify(OSError(code, "x")).kind == kind


def test_a_full_ledger_is_disk_full(tmp_path: Path) -> None:
    """SQLite's own "database or disk is full" (here: a page limit) is the place's fault, like
    ENOSPC."""
    with closing(sqlite3.connect(tmp_path / "l.sqlite3")) as db:
        db.execute("CREATE TABLE t (x BLOB)")
        db.execute("PRAGMA max_page_count = 4")
        with pytest.raises(sqlite3.Error) as raised:
            for _ in range(100):
                db.execute("INSERT INTO t VALUES (zeroblob(4096))")
    error = classify(raised.value)
    assert isinstance(error, errors.DiskFull) and "ledger" in error.message


def test_a_read_only_ledger_is_not_writable(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    with (
        closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db,
        pytest.raises(sqlite3.Error) as raised,
    ):
        db.execute("INSERT INTO t VALUES (1)")
    assert isinstance(classify(raised.value), errors.OutputNotWritable)


def _locked(path: Path) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN IMMEDIATE")
        with closing(sqlite3.connect(path, timeout=0)) as db:
            db.execute("INSERT INTO t VALUES (1)")


def _read_only(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        db.execute("INSERT INTO t VALUES (1)")


def _full(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x BLOB)")
        db.execute("PRAGMA max_page_count = 4")
        for _ in range(100):
            db.execute("INSERT INTO t VALUES (zeroblob(4096))")


def _not_a_database(path: Path) -> None:
    path.write_bytes(b"not SQLite at all" * 512)
    with closing(sqlite3.connect(path)) as db:
        db.execute("SELECT * FROM sqlite_master")


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (_locked, errors.SQLITE_BUSY),
        (_read_only, errors.SQLITE_READONLY),
        (_full, errors.SQLITE_FULL),
        (_not_a_database, errors.SQLITE_NOTADB),
    ],
)
def test_sqlite_code_reads_the_code_or_else_sqlites_message(
    tmp_path: Path, cause: Callable[[Path], None], code: int
) -> None:
    """The code where Python gives it (3.11+), else SQLite's message (3.10): the same for real
    SQLite errors."""
    with pytest.raises(sqlite3.Error) as raised:
        cause(tmp_path / "l.sqlite3")
    assert errors.sqlite_code(raised.value) == code
    # no code attached: the message
    assert errors.sqlite_code(type(raised.value)(*raised.value.args)) == code
    assert errors.sqlite_code(sqlite3.OperationalError("no such table: t")) == 0
    assert errors.sqlite_code(OSError(errno.ENOSPC, "x")) == 0


def test_an_asyncio_timeout_is_transient_on_every_python() -> None:
    """A class apart from the builtin ``TimeoutError`` (an ``OSError``) before 3.11; transient
    either way."""
    assert classify(asyncio.TimeoutError()).retryable and classify(TimeoutError()).retryable


def test_an_s3_outage_past_the_calls_retries_uses_none_of_the_documents_attempts() -> None:
    """A bucket that does not answer is the place's fault: what survives ``s3client.call``'s
    retries is retried by the job for as long as it lasts, however few attempts the document has."""
    import botocore.exceptions

    from ocrwatch.config import RetryConfig
    from ocrwatch.infra.metrics import Metrics
    from ocrwatch.infra.s3client import storage_error
    from ocrwatch.jobs.attempts import attempts_of_a_job

    outage = botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3")
    error = storage_error(outage, "reading s3://b/k")
    assert isinstance(error, errors.PlaceFault) and error.kind == "storage_unavailable"
    failures = [error] * 4

    async def job() -> int:
        retry = RetryConfig(attempts=1, backoff_initial_seconds=0, backoff_max_seconds=0)
        tries = 0
        async for attempt in attempts_of_a_job(retry, Metrics(), asyncio.Event()):
            with attempt:
                tries += 1
                if failures:
                    raise failures.pop()
        return tries

    assert asyncio.run(job()) == 5
