"""The error hierarchy: which failures are the document's, which the place's, and how raw errors map onto it."""

from __future__ import annotations

import errno
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ocrwatch import errors
from ocrwatch.errors import classify


@pytest.mark.parametrize("kind", [errors.DiskFull, errors.OutputNotWritable])
def test_faults_of_the_place_are_retried_never_permanent(kind: type[errors.OcrwatchError]) -> None:
    error = kind("x")
    assert isinstance(error, errors.PlaceFault) and error.retryable
    assert "retries" in error.hint and "ocrwatch retry" not in error.hint


@pytest.mark.parametrize("kind", [errors.OutputConflict, errors.NameTooLong])
def test_what_needs_the_user_is_permanent(kind: type[errors.OcrwatchError]) -> None:
    error = kind("x")
    assert isinstance(error, errors.PermanentError) and not error.retryable
    assert not isinstance(error, errors.PlaceFault)


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, "disk_full"), (errno.EDQUOT, "disk_full"),
                                            (errno.EROFS, "output_not_writable"), (errno.EACCES, "output_not_writable"),
                                            (errno.ENAMETOOLONG, "name_too_long")])  # fmt: skip
def test_os_errors(code: int, kind: str) -> None:
    assert classify(OSError(code, "x")).kind == kind


def test_a_full_ledger_is_disk_full(tmp_path: Path) -> None:
    """SQLite's own "database or disk is full" (here: a page limit) is the place's fault, like ENOSPC."""
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
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db, pytest.raises(sqlite3.Error) as raised:
        db.execute("INSERT INTO t VALUES (1)")
    assert isinstance(classify(raised.value), errors.OutputNotWritable)
