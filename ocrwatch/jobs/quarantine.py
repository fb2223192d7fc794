"""What becomes of a failed document its source sets aside: moved to its inbox's
``quarantine_dir``, its error sidecar with it only where the record of outputs holds the very file
there as ocrwatch's own.

The source decides whether a document goes (``Source.finish`` answers a failure with a
``Quarantine``, or None): it knows its inbox, its ``quarantine_dir`` and whether a new version is
being written. This layer, which holds the record of outputs, carries the move out, so no rule of
it is handed down: ``sources.quarantine`` walks both sides by descriptor and keeps the folders open
while the error sidecar, opened there, is judged (``sinks.ownership.judge``) and taken along.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from ocrwatch.errors import OcrwatchError
from ocrwatch.sinks.local import json_marked
from ocrwatch.sinks.ownership import judge
from ocrwatch.sources.base import Quarantine
from ocrwatch.sources.quarantine import Aside, set_aside
from ocrwatch.store.written import Written

log = structlog.get_logger()


async def quarantine(request: Quarantine, written: Written | None) -> dict[str, str] | None:
    """Carry out a source's ``request``: where the document and its error sidecar went
    (``source``: a URI; ``json``), for its hooks; None where the move failed (logged: the document
    stays where it failed)."""
    try:
        moved, error = await asyncio.to_thread(move, request, written)
    except (OSError, OcrwatchError) as exc:
        log.error("local_quarantine_failed", path=str(request.path), error=str(exc))
        return None
    log.warning("local_quarantined", path=str(request.path), to=str(moved))
    carried = {} if error is None else {"json": str(error), "md": ""}
    return {"source": moved.as_uri(), **carried}


def move(request: Quarantine, written: Written | None) -> tuple[Path, Path | None]:
    """Move the failed document aside, with its error sidecar where ``written`` (None: only an
    older ocrwatch's mark, on a file of the daemon's user) holds it as ocrwatch's. Blocking. Where
    the document went, and where its error sidecar went (None: it stayed). Raises as
    ``sources.quarantine.set_aside``."""
    with set_aside(request) as aside:
        fd = aside.here.open_read(aside.error)
        if fd is not None:
            try:
                if _ours(aside, request.root, written):
                    aside.carry(fd)
            finally:
                os.close(fd)
    return aside.moved, aside.carried


def _ours(aside: Aside, root: Path, written: Written | None) -> bool:
    """Whether the error sidecar the document left is ocrwatch's own for a source of its owner."""
    records = written.get(root, aside.below) if written is not None else []
    here, name = aside.here, aside.error
    return judge(records, here, name, aside.owner, not records and json_marked(here, name)).ours
