"""The error hierarchy: every failure is either transient (retry later) or permanent (write an error
sidecar).

A ``PlaceFault`` is the transient kind that is not the document's doing (a full disk, a folder that
cannot be written, an object store that does not answer): it is waited out however long it lasts and
never becomes a failure of the document.

Each class carries a stable ``kind`` used in logs, the ledger and sidecars, and a ``hint`` that
tells the user what to do about it. ``classify`` is the one place that maps an arbitrary exception
onto this hierarchy, and ``quarantined`` the one place that says which failures an inbox's
``quarantine_dir`` takes.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3


class OcrwatchError(Exception):
    """Base of every error ocrwatch reports about a document or its configuration."""

    kind: str = "internal_error"
    retryable: bool = False
    hint: str = "this is a bug in ocrwatch; please report it with the log line"
    quarantined: bool = False
    """Whether a document failed so goes to its inbox's ``quarantine_dir``: only where its own bytes
    are at fault, so that only a new file can cure it. Any other stays where it was dropped, where
    the fix its hint names (a file moved away, a setting, a package) and ``ocrwatch retry`` find
    it."""
    path_fault: bool = False
    """Whether the failure was only what the document's path was at that moment (vanished, a link,
    rewritten throughout), so the same file seen again whole at that path is processed again."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS.setdefault(cls.kind, cls)

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "message": self.message,
            "retryable": self.retryable,
            "hint": self.hint,
        }


_KINDS: dict[str, type[OcrwatchError]] = {OcrwatchError.kind: OcrwatchError}
"""Each kind's class, so that a failure known only by its kind (a ledger row's) is judged as its
class."""


def quarantined(kind: str | None) -> bool:
    """Whether a document failed as ``kind`` goes to ``quarantine_dir``
    (``OcrwatchError.quarantined``); an unknown kind, or none, stays."""
    found = _KINDS.get(kind or "")
    return found is not None and found.quarantined


def path_fault(kind: str | None) -> bool:
    """Whether a document failed as ``kind`` failed for its path only
    (``OcrwatchError.path_fault``)."""
    found = _KINDS.get(kind or "")
    return found is not None and found.path_fault


class PermanentError(OcrwatchError):
    """Retrying cannot help: the input itself is the problem."""


class TransientError(OcrwatchError):
    """The same input may succeed later: retried with backoff."""

    kind = "transient"
    retryable = True
    hint = "ocrwatch retries this automatically"


class ConfigError(OcrwatchError):
    """The configuration file is invalid; raised only at start-up (exit code 2)."""

    kind = "config_error"
    hint = "fix the named key in the configuration file"


# --- permanent: the input -------------------------------------------------------------------------


class EmptyFile(PermanentError):
    kind = "empty_file"
    hint = "the file has zero bytes; copy it again"
    quarantined = True


class NotADocument(PermanentError):
    kind = "not_a_document"
    hint = "only PDF, PNG, JPEG, TIFF and WebP files are recognised, by content not by extension"
    quarantined = True


class EncryptedPdf(PermanentError):
    kind = "encrypted_pdf"
    hint = (
        "the PDF needs a password to open; remove the password (e.g. qpdf --decrypt) and drop it "
        "again"
    )
    quarantined = True


class CorruptPdf(PermanentError):
    kind = "corrupt_pdf"
    hint = "the PDF is damaged or truncated; re-export or repair it (e.g. qpdf, mutool clean)"
    quarantined = True


class CorruptImage(PermanentError):
    kind = "corrupt_image"
    hint = "the image is damaged or truncated; export it again"
    quarantined = True


class NoPages(PermanentError):
    kind = "no_pages"
    hint = (
        "open it in a PDF viewer: if it shows pages, save or print it to a new PDF from there and "
        "drop that; if it shows none, export the document again from the program that made it"
    )
    quarantined = True


class TooManyPages(PermanentError):
    kind = "too_many_pages"
    hint = "raise [limits] max_pages or split the document"


class TooManyPixels(PermanentError):
    kind = "too_many_pixels"
    hint = (
        "the page cannot be rendered within [render] max_pixels even at the smallest usable "
        "resolution"
    )


class RenderMemoryExceeded(PermanentError):
    """pdftoppm ran out of the memory a renderer child may map (``render.child_memory``): the page
    asks for more than that bound, every time it is rendered. The machine running short shows
    otherwise (the kernel kills the child: ``render_failed``)."""

    kind = "render_memory_exceeded"
    hint = (
        "rendering the page needed more memory than a renderer may use ([render] "
        "decode_budget_mb, plus 256 MiB); raise decode_budget_mb if the document is genuine, "
        "then `ocrwatch retry`"
    )


class FileTooLarge(PermanentError):
    kind = "file_too_large"
    hint = "raise [limits] max_bytes or split the document"


class NotARegularFile(PermanentError):
    kind = "not_a_regular_file"
    path_fault = True
    hint = (
        "only regular files inside the inbox are processed (no FIFOs, devices or escaping symlinks)"
    )


class NameTooLong(PermanentError):
    kind = "name_too_long"
    hint = (
        "a sidecar's name would exceed the folder's file-name limit (255 bytes on most "
        "filesystems); give the file a shorter name"
    )


class OutputConflict(PermanentError):
    """Something ocrwatch did not write holds a sidecar's name: only the user can say what becomes
    of it."""

    kind = "output_conflict"
    hint = (
        "a file or folder that ocrwatch did not write holds a sidecar's name; move it away, "
        "then `ocrwatch retry`"
    )


class UntrustedFolder(PermanentError):
    """A folder that already stands for an inbox folder (or a document's figures) under
    ``[output] dir``, ``archive_dir`` or ``quarantine_dir`` is not owned and moded as ocrwatch
    makes it: another user may have made it, or the inbox folder changed hands or modes since.
    Nothing is written through it. The place's fault, not the document's: the error sidecar is
    written where it can be, and the document comes back when next seen (a path fault) once the
    folder is fixed."""

    kind = "untrusted_folder"
    path_fault = True
    hint = (
        "a folder ocrwatch writes through is not owned and moded as the folder it stands for; "
        "give it the owner and mode named (chown, chmod) or move it away (ocrwatch makes it "
        "anew); the document is taken again when the inbox is next scanned"
    )


class PageFailed(PermanentError):
    """Every rung of the retry ladder failed for a page (recorded per page; the document becomes
    partial)."""

    kind = "page_failed"
    hint = "the model could not produce stable output for this page"


# --- transient: the world -------------------------------------------------------------------------


class RenderTimeout(TransientError):
    kind = "render_timeout"
    hint = "rendering took longer than [render] timeout_seconds; raise it or lower [render] dpi"


class RenderFailed(TransientError):
    kind = "render_failed"
    hint = (
        "the renderer (pdftoppm) was killed while rendering a page, e.g. for memory; retried, "
        "then the document fails"
    )


class EngineFailed(TransientError):
    kind = "engine_failed"
    hint = "the OCR engine failed on this page; it is retried, then the page is marked failed"


class EngineDead(TransientError):
    kind = "engine_dead"
    hint = "the OCR engine died; ocrwatch rebuilds it and requeues the pages that were in flight"


class PageTimeout(TransientError):
    kind = "page_timeout"
    hint = "the engine did not answer within [engine] page_timeout_seconds"


class SourceGone(PermanentError):
    kind = "source_gone"
    path_fault = True
    hint = "the file disappeared before it could be processed"


class CrashLoop(PermanentError):
    kind = "crash_loop"
    hint = (
        "the daemon died repeatedly while processing this document; check the log, then "
        "`ocrwatch retry`"
    )


class SourceChanged(TransientError):
    kind = "source_changed"
    path_fault = True
    hint = "the file changed while it was processed; it is processed again"


class SourceInUse(TransientError):
    """A source that a writer or another name still holds is never moved or deleted, lest the
    writer's later bytes go into an unlinked file or the other name lose its content; ``reason``
    says which."""

    kind = "source_in_use"
    hint = "the file stays; once closed (or left with one name) it is handled when it is next seen"

    def __init__(self, message: str, reason: str, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_in = retry_in  # seconds until it is worth trying again (None: when next seen)


class PlaceFault(TransientError):
    """The place is at fault, not the document (a full disk, a folder that cannot be written):
    retried for as long as it lasts, without using up the document's attempts."""

    kind = "place_fault"


class DiskFull(PlaceFault):
    kind = "disk_full"
    hint = (
        "no space left for sidecars or temporary files; free space, ocrwatch retries until it can "
        "write"
    )


class OutputNotWritable(PlaceFault):
    kind = "output_not_writable"
    hint = (
        "ocrwatch cannot write there (sidecars beside the source, or state_dir/tmp); make the "
        "folder writable "
        "or set [output] dir; ocrwatch retries until it can write"
    )


class StorageUnavailable(PlaceFault):
    """An outage of the object store or queue outlasted the S3 call's retries: the place's fault."""

    kind = "storage_unavailable"
    hint = "the object store or queue did not answer; ocrwatch retries with backoff"


# SQLite's primary result codes that ocrwatch tells apart; the sqlite3 module names them from Python
# 3.11 on.
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_NOTADB = (
    5,
    6,
    8,
    11,
    13,
    26,
)

# How each one's message begins (SQLite's own English, fixed): Python 3.10's exceptions carry no
# code.
_SQLITE_MESSAGES = {
    "database is locked": SQLITE_BUSY,
    "database table is locked": SQLITE_LOCKED,
    "database schema is locked": SQLITE_LOCKED,
    "attempt to write a readonly database": SQLITE_READONLY,
    "database disk image is malformed": SQLITE_CORRUPT,
    "database or disk is full": SQLITE_FULL,
    "file is not a database": SQLITE_NOTADB,
}


def sqlite_code(exc: BaseException) -> int:
    """The primary SQLite result code behind ``exc`` (one of those above, or another), 0 when there
    is none."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF
    if not isinstance(exc, sqlite3.Error):
        return 0
    message = str(exc)
    return next((code for start, code in _SQLITE_MESSAGES.items() if message.startswith(start)), 0)


def classify(exc: BaseException) -> OcrwatchError:
    """Map any exception onto the hierarchy, so the caller never has to guess retryability."""
    if isinstance(exc, OcrwatchError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return SourceGone(str(exc))
    # the ledger's folder full or read-only is the place's fault too
    if isinstance(exc, sqlite3.Error):
        code = sqlite_code(exc)
        if code == SQLITE_FULL:
            return DiskFull(f"the ledger cannot grow: {exc}")
        if code == SQLITE_READONLY:
            return OutputNotWritable(
                f"the ledger cannot be written: {exc}", hint="make state_dir writable"
            )
    # an OSError from Python 3.11 on, taken by the branch below
    if isinstance(exc, asyncio.TimeoutError):
        return TransientError(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFull(str(exc))
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return OutputNotWritable(str(exc))
        if exc.errno == errno.ENAMETOOLONG:
            return NameTooLong(str(exc))
        return TransientError(f"{type(exc).__name__}: {exc}")
    return OcrwatchError(f"{type(exc).__name__}: {exc}")
