"""Where sidecars go: beside a local file, or beside an S3 key.

Sink contract: methods are blocking and called from worker threads, one job at a time per document.
``write`` writes the Markdown first and the JSON last (the JSON is the commit marker); each object appears
whole or not at all. ``write`` also removes a stale error sidecar. ``recorded`` returns the ``source`` section
of the existing JSON sidecar, so a job whose content is unchanged is recognised as done without a ledger.
Sidecars are named by ``ocrwatch.naming.sidecar_names``, which sources share to ignore them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ocrwatch.sources.base import Job


@runtime_checkable
class Sink(Protocol):
    def recorded(self, job: Job) -> dict[str, Any] | None:
        """The ``source`` section of the job's existing JSON sidecar, or None."""

    def write(self, job: Job, markdown: str, document: dict[str, Any]) -> None:
        """Write ``NAME.md`` then ``NAME.json`` atomically, and remove ``NAME.error.json``."""

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        """Write ``NAME.error.json`` atomically."""

