"""Where sidecars go: beside a local file, or beside an S3 key.

Sink contract: methods are blocking and called from worker threads, one job at a time per document.

- ``write`` writes the Markdown first, then the further outputs (``extras``: the searchable PDF, the
  figures under ``NAME.assets/``), and the JSON last (the JSON is the commit marker); each object
  appears whole or not at all. It checks everything it can before writing anything (every sidecar's
  name fits, the place is writable, no foreign file holds a name it writes), so a known fault never
  leaves half a result; once the JSON is written, removing a stale error sidecar, or outputs a
  previous version wrote and this one does not, never fails the document.
- ``write_error`` writes the error sidecar, and once it is durable removes the ``md`` and ``json``
  sidecars (and the further outputs) a previous version of the source left: a failed document never
  keeps an "ok" result for content that is no longer there.
- Only what ocrwatch wrote for the document is ever replaced or removed, by the record of outputs
  (one rule, ``sinks.ownership``: ``judge`` for a file, ``judge_object`` for an object); a mark
  counts only for outputs the record predates. Anything else at a sidecar's name (a user's file, a
  folder, a FIFO, a link) is refused as ``output_conflict``, naming it. Only the names
  ``naming.FIGURE_FILE`` are touched in ``NAME.assets/``.
- ``recorded`` returns the ``source`` section of the existing JSON sidecar, so a job whose content
  is unchanged is recognised as done without a ledger; it reads a bounded head (``HEAD_BYTES``,
  through ``json_member``) and never blocks on, or reads without limit from, whatever lies at the
  name.

Sidecars are named by ``ocrwatch.naming.sidecar_names``, which sources share to ignore them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ocrwatch.naming import FIGURE_FILE, LAYOUTS
from ocrwatch.safefs import Access
from ocrwatch.sources.base import Job
from ocrwatch.store.ledger import Fingerprint, same_content

HEAD_BYTES = 256 * 1024
"""How much of a JSON sidecar is read to learn whose it is and what it describes: ``schema`` and
``source`` come first and take a few kB at most, while the whole file grows with the pages (tens of
MB for a long document)."""

_SPACE = re.compile(r"\s*")

RECALL_BYTES = 64 * 1024 * 1024
"""The largest sidecar ``recall`` reads whole; a larger result is done again rather than held in
memory."""

Extra = bytes | Path
"""A further output's content: bytes, or a file (in the job's spool folder) copied as it is."""
NO_EXTRAS: Mapping[str, Extra] = {}


def extra_names(extras: Mapping[str, Extra], outputs: dict[str, str]) -> None:
    """Check that every extra is named as ``naming.output_names`` says (``outputs``): the searchable
    PDF, the ALTO or hOCR file, or one figure file right inside the assets folder; anything else is
    a bug, never a path to follow."""
    files = {outputs[kind] for kind in ("pdf", *LAYOUTS)}
    for name in extras:
        folder, _, file = name.rpartition("/")
        if name not in files and not (folder == outputs["assets"] and FIGURE_FILE.fullmatch(file)):
            raise ValueError(f"{name!r} is not a name ocrwatch writes beside {outputs['pdf']!r}")


@dataclass(frozen=True)
class Recalled:
    """A document's sidecars as ocrwatch wrote them: its Markdown's bytes and its JSON."""

    markdown: bytes
    document: dict[str, Any]

    @classmethod
    def parse(cls, markdown: bytes | None, raw: bytes | None) -> Recalled | None:
        """None unless both were read whole and the JSON is an object."""
        if markdown is None or raw is None:
            return None
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None
        return cls(markdown, document) if isinstance(document, dict) else None


@runtime_checkable
class Sink(Protocol):
    def recorded(self, job: Job) -> dict[str, Any] | None:
        """The ``source`` section of the job's existing JSON sidecar, or None."""

    def write(
        self,
        job: Job,
        markdown: str,
        document: dict[str, Any],
        extras: Mapping[str, Extra] = NO_EXTRAS,
        access: Access | None = None,
    ) -> None:
        """Write ``NAME.md``, the ``extras``, then ``NAME.json`` atomically, and remove
        ``NAME.error.json``. ``access``: who may read the local source (None where a sink's place
        has rules of its own, S3's)."""

    def status(self, job: Job) -> str | None:
        """The ``status`` of the job's existing JSON sidecar (``ok``, ``partial``), or None."""

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        """Write ``NAME.error.json`` atomically, then remove the ``NAME.md`` and ``NAME.json``
        ocrwatch wrote."""

    def recall(self, job: Job, owner: int | None) -> Recalled | None:
        """The job's sidecars read whole where they are ocrwatch's own for it, unchanged since
        written, for a source of ``owner`` (a local file's user; None for S3): a result a copy of
        the same bytes may take."""


def markdown_bytes(markdown: str) -> bytes:
    """The Markdown sidecar's bytes, for every sink alike: a lone surrogate from a model becomes
    "?", not a failed document (nor one that fails in one sink and not the other)."""
    return markdown.encode("utf-8", "replace")


def json_member(head: bytes, name: str) -> Any:
    """The value of the top-level member ``name`` of the JSON object whose first bytes are ``head``,
    or None when ``head`` does not hold it whole (the rest of the file is never needed)."""
    for key, value in _members(head.decode("utf-8", "replace")):
        if key == name:
            return value
    return None


def recorded_fingerprint(recorded: dict[str, Any]) -> Fingerprint:
    """The fingerprint a JSON sidecar's ``source`` section (what ``recorded`` returns) records."""
    return Fingerprint(
        size=int(recorded.get("bytes") or 0),
        mtime_ns=None,
        sha256=recorded.get("sha256"),
        etag=recorded.get("etag"),
        version_id=recorded.get("version_id"),
    )


def records(recorded: dict[str, Any] | None, fingerprint: Fingerprint) -> bool:
    """Whether a sidecar's ``source`` section (``recorded``'s answer) describes this very
    content."""
    return recorded is not None and same_content(recorded_fingerprint(recorded), fingerprint)


def done(sink: Sink, job: Job, fingerprint: Fingerprint) -> bool:
    """The one answer to "is this document already done?": its own sidecars record this content
    (blocking: the sink reads them). A ledger row only says a run ended, not that its result
    stands."""
    return records(sink.recorded(job), fingerprint)


def dump_json(document: dict[str, Any]) -> bytes:
    """UTF-8 JSON; strings that are not valid Unicode (a file name in another encoding, a model's
    lone surrogate) are kept as ``\\udcXX`` escapes, which round-trip, rather than failing the
    document."""
    text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(document, ensure_ascii=True, indent=2) + "\n").encode("ascii")


def _members(text: str) -> Iterator[tuple[str, Any]]:
    """The top-level members of the JSON object ``text`` begins with, in order, as far as ``text``
    holds them."""
    decoder = json.JSONDecoder()
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return
    at += 1
    while True:
        try:
            key, at = decoder.raw_decode(text, _skip(text, at))
            at = _skip(text, at)
            if not isinstance(key, str) or not text.startswith(":", at):
                return
            value, at = decoder.raw_decode(text, _skip(text, at + 1))
        except (ValueError, RecursionError):  # cut off by the head's end, not JSON, or too deep
            return
        yield key, value
        at = _skip(text, at)
        if not text.startswith(",", at):
            return
        at += 1


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return match.end() if match else at
