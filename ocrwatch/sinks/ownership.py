"""Who owns an output: the one rule that says whether what lies at an output's name is ocrwatch's to
replace, move or remove for a document, and why not; the local and S3 sinks, the archive and the
quarantine all ask it here.

A mark inside a file (a JSON's ``schema``, a PDF's ``/OcrwatchSource``) can be copied by anyone, and
an output given to its source's owner can be edited by them, so neither may decide that a file is
ocrwatch's. The record of what ocrwatch wrote (``store.written``) can: a name holds ocrwatch's own
file for a document only when the file there is the one recorded, bit for bit, and was made from a
source of the same owner (Bob's new document never replaces or removes what was made from Alice's,
even at the same name). A file's row lies in the ledger's file (``judge``); an S3 object carries its
row in its own metadata (``judge_object``): its ETag, or its bytes read again where the server's
ETag is no MD5, must be the MD5 recorded. One ``rule`` judges both.

Outputs written before the record existed carry no row: such an output is taken as ocrwatch's once,
where its own mark says so **and** what no user can arrange says an older ocrwatch wrote it (a file
of the daemon's user; an object with the metadata every ocrwatch put on its outputs). The mark of
each kind of output (``marked``, ``pdf_marked``): a JSON sidecar whose first member is ``"schema":
"ocrwatch/1"``, a Markdown sidecar that begins with ``<!-- page`` (by its own mark alone, never by
the JSON beside it, so a user's edit to it stands), a figure by its PNG text chunk
(``figures.is_ours``), a searchable PDF by the JSON beside it recording one or else by its document
information (``textlayer.is_ours``), an ALTO or hOCR file by the JSON recording it; a JSON says so
only where it is the daemon's user's too (``json_vouches``). Where in a file each mark sits is read
beside the code that writes it; which mark counts, and when, is decided here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import unquote

from ocrwatch.recognize import figures
from ocrwatch.results import textlayer
from ocrwatch.results.assemble import PAGE_MARK, SCHEMA_ID
from ocrwatch.safefs import Folder, describe, hash_fd
from ocrwatch.sinks.base import json_member
from ocrwatch.store.written import MD5_KEY, OLDER_KEY, OWNER_KEY, Output


@dataclass(frozen=True)
class Verdict:
    """Whether a name holds nothing or ocrwatch's own output for a document (``ours``), and where it
    does not, ``why``: what lies there instead, as a message names it."""

    ours: bool
    why: str = ""

    def __bool__(self) -> bool:
        raise TypeError("a Verdict has no truth value: ask its ``ours``")


OURS = Verdict(True)


def theirs(why: str) -> Verdict:
    """A name that holds what ocrwatch may not replace for the document: ``why`` says what."""
    return Verdict(False, why)


def rule(
    recorded: bool, owners: Sequence[int | str], owner: int | str | None, older: bool, what: str
) -> Verdict:
    """The one ownership rule, for a file and an S3 object alike, once something lies at the name:
    ``recorded``, whether the record holds an output there at all; ``owners``, the owners of those
    it holds with the very content found; ``owner``, whose document this is (a local source's uid,
    an S3 source's ``object_owner``; None: unknown, so nothing is ours); ``older``, it carries
    ocrwatch's mark and what no user can arrange says an ocrwatch older than the record wrote it."""
    if not recorded:
        return OURS if older and owner is not None else theirs(f"{what} ocrwatch did not write")
    if not owners:
        return theirs(f"{what} ocrwatch did not write, or one changed since ocrwatch wrote it")
    if owner is None or owner not in owners:
        other = "a document of another user" if isinstance(owners[0], int) else owners[0]
        return theirs(f"ocrwatch's output for {other}")
    return OURS


# --- a file: the record's rows in the ledger's file -----------------------------------------------


def judge(
    records: list[Output],
    folder: Folder,
    name: str,
    owner: int | None,
    marked: bool,
    *,
    verify: bool = True,
) -> Verdict:
    """Whether the file at ``name`` in ``folder`` is ocrwatch's to replace or remove for a document
    whose source belongs to ``owner`` (None: unknown, so nothing is). ``records``: what the record
    says was written there; ``marked``: the file carries ocrwatch's own mark, which counts only
    where no row exists and the file belongs to the daemon's user (an output of an ocrwatch older
    than the record). ``verify``: compare the content's sha256 too (before anything is replaced or
    removed), not only the inode and size."""
    fd = folder.open_read(name)
    if fd is None:
        info = folder.lstat(name)
        return OURS if info is None else theirs(describe(info.st_mode))
    try:
        info = os.fstat(fd)
        older = marked and info.st_uid == os.geteuid()
        same = [r for r in records if (r.inode, r.size) == (info.st_ino, info.st_size)]
        if verify and same:
            digest = hash_fd(fd)
            same = [r for r in same if r.sha256 == digest]
    finally:
        os.close(fd)
    return rule(bool(records), [r.owner for r in same], owner, older, "a file")


def vouched(records: list[Output], info: os.stat_result, digest: str, owner: int | None) -> bool:
    """Whether the record holds the file of ``info`` whose content hashed to ``digest`` as
    ocrwatch's output, unchanged since written, for a document of ``owner``'s: what ``judge`` asks,
    for bytes already read (a mark never vouches: an older ocrwatch's result is done again)."""
    wanted = (info.st_ino, info.st_size, digest, owner)
    return owner is not None and any(
        (r.inode, r.size, r.sha256, r.owner) == wanted for r in records
    )


# --- an S3 object: the row in the object's own metadata -------------------------------------------


@dataclass(frozen=True)
class Stored:
    """An S3 object as a read of it found it: its ETag (without quotes) and user metadata."""

    etag: str
    metadata: Mapping[str, str]


def judge_object(
    stored: Stored | None,
    owner: str | None,
    marked: Callable[[], bool],
    md5: Callable[[], str | None],
) -> Verdict:
    """``judge`` for the S3 object ``stored`` (None: no object there), for a document whose source
    is ``owner`` (``written.object_owner``). The object is the one its record names where its ETag
    is the MD5 recorded, or (a server whose ETag is no MD5: SSE-KMS, a multipart upload) ``md5()``,
    of its bytes read again, is. ``marked``: it carries ocrwatch's mark, which counts only where it
    carries no record but the metadata an older ocrwatch put on its outputs."""
    if stored is None:
        return OURS
    meta = stored.metadata
    recorded = OWNER_KEY in meta and MD5_KEY in meta
    owners: list[int | str] = []
    if recorded and (meta[MD5_KEY] == stored.etag or meta[MD5_KEY] == md5()):
        owners.append(unquote(meta[OWNER_KEY]))
    older = not recorded and OLDER_KEY in meta and marked()
    return rule(recorded, owners, owner, older, "an object")


# --- the marks: which counts for each kind of output ----------------------------------------------


def owns_json(head: bytes) -> bool:
    """Whether a JSON file beginning with ``head`` is one ocrwatch wrote (a result or an error
    sidecar)."""
    return json_member(head, "schema") == SCHEMA_ID


def owns_markdown(head: bytes) -> bool:
    """Whether a Markdown file beginning with ``head`` is one ocrwatch wrote (it always opens with
    page 1)."""
    return head.startswith(PAGE_MARK.encode())


def marked(kind: str, head: bytes) -> bool:
    """Whether an output of ``kind`` (``md``, ``json``, ``error``, ``assets``: a figure) beginning
    with ``head`` carries ocrwatch's own mark (a searchable PDF: ``pdf_marked``)."""
    if kind == "md":
        return owns_markdown(head)
    if kind == "assets":
        return figures.is_ours(head)
    if kind in ("json", "error"):
        return owns_json(head)
    raise ValueError(f"no mark rule for {kind!r}")


def json_vouches(info: os.stat_result) -> bool:
    """Whether the JSON sidecar of ``info`` may say which further outputs an older ocrwatch wrote
    beside it (``pdf_recorded``, ``layout_recorded``): only one of the daemon's user, as those
    outputs must be. A JSON given to its source's owner, or made by a user, is theirs to write at
    will: it would let them claim a file of the daemon's user at an output's name."""
    return info.st_uid == os.geteuid()


def pdf_recorded(json_head: bytes | None) -> bool:
    """Whether the JSON sidecar beginning with ``json_head`` (None: there is none) is ocrwatch's and
    records a searchable PDF."""
    if json_head is None or not owns_json(json_head):
        return False
    section = json_member(json_head, "searchable_pdf")
    return isinstance(section, dict) and "path" in section


def layout_recorded(json_head: bytes | None, kind: str) -> bool:
    """Whether the JSON sidecar beginning with ``json_head`` is ocrwatch's and records its ``kind``
    file (``alto``, ``hocr``): the mark of such a file where the record of outputs holds no row
    for it (``ocrwatch ocr`` without a daemon), as the JSON is of a searchable PDF."""
    if json_head is None or not owns_json(json_head):
        return False
    section = json_member(json_head, kind)
    return isinstance(section, dict) and "path" in section


Whole = Callable[[], contextlib.AbstractContextManager[BinaryIO | None]]
"""The whole file or object, seekable (None: it is gone), opened only when it is asked for."""


def pdf_marked(recorded: bool, whole: Whole) -> bool:
    """The mark of a searchable PDF: ``recorded``, the JSON sidecar beside it is ocrwatch's and
    records one (``pdf_recorded``, asked before that JSON is replaced or removed), or the PDF itself
    carries ocrwatch's mark (a write that never reached its JSON left it), read only where the JSON
    does not say."""
    if recorded:
        return True
    with whole() as content:
        return content is not None and textlayer.is_ours(content)
