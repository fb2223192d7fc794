"""Further outputs in a local folder (the searchable PDF, the figures under ``NAME.assets/``): the checks made
before anything is written, the figures' folder, and the removal of what a previous version left.

The rule of ``sinks.base`` holds: only ocrwatch's own files are replaced or removed. A further output is
ocrwatch's when the JSON sidecar beside it is and records it (``searchable_pdf.path``), or by its own mark (the
searchable PDF's ``textlayer.is_ours``, a figure's ``figures.is_ours``), so the outputs of a write that never
reached its JSON are known as ocrwatch's too. Inside
the assets folder only the names ``naming.FIGURE_FILE`` are ever touched, and the folder is removed only once
empty.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import structlog

from ocrwatch import figures, textlayer
from ocrwatch.errors import OutputConflict
from ocrwatch.naming import FIGURE_FILE
from ocrwatch.sinks.base import Extra

log = structlog.get_logger()

Look = Callable[[Path, int], Any]
"""``sinks.local.look``: what lies at a name, without following a link or blocking."""
PROBE_BYTES = 4096


def check(
    outputs: dict[str, Path], extras: Mapping[str, Extra], pdf_ours: bool, look: Look,
    conflict: Callable[[Path, str], OutputConflict],
) -> None:  # fmt: skip
    """Refuse, before anything is written, an extra whose name holds something ocrwatch did not write."""
    folder = outputs["pdf"].parent
    targets = [folder / name for name in extras]
    if outputs["pdf"] in targets:
        found = look(outputs["pdf"], 0)
        if found is not None and (found.other is not None or not pdf_ours):
            raise conflict(outputs["pdf"], found.other or "a file ocrwatch did not write")
    named = [path for path in targets if path.parent == outputs["assets"]]
    if not named:
        return
    info = _lstat(outputs["assets"])
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise conflict(outputs["assets"], "not a folder")
    for path in named:
        found = look(path, PROBE_BYTES)
        if found is not None and (found.other is not None or not figures.is_ours(found.head)):
            raise conflict(path, found.other or "a file ocrwatch did not write")


def pdf_marked(path: Path) -> bool:
    """Whether the regular file at ``path`` is a searchable PDF ocrwatch marked (``textlayer.is_ours``); opened
    without following a link or blocking on a FIFO, and read by qpdf only where it needs to."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        return stat.S_ISREG(os.fstat(fd).st_mode) and textlayer.is_ours(handle)


def make_assets(folder: Path, fsync_dir: Callable[[Path], None]) -> None:
    """The figures' folder, made where missing (its entry fsynced in its parent) and never through a link."""
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise NotADirectoryError(f"{folder} is not a folder") from None
        return
    fsync_dir(folder.parent)


def remove_stale(
    outputs: dict[str, Path], kept: Collection[str], *, pdf: bool, look: Look, fsync_dir: Callable[[Path], None]
) -> None:
    """Remove the outputs not in ``kept`` (names relative to the sidecars' folder): the searchable PDF when
    ``pdf`` (ocrwatch's JSON recorded it), every figure ocrwatch marked in the assets folder, then
    the folder once empty. A failure is logged, never raised: what was just written stands."""
    folder = outputs["pdf"].parent
    doomed = [outputs["pdf"]] if pdf and outputs["pdf"].name not in kept else []
    info = _lstat(outputs["assets"])
    if info is not None and stat.S_ISDIR(info.st_mode):
        try:
            names = os.listdir(outputs["assets"])
        except OSError as exc:
            log.warning("stale_output_not_removed", path=str(outputs["assets"]), error=str(exc))
            names = []
        for name in names:
            path = outputs["assets"] / name
            if FIGURE_FILE.fullmatch(name) and f"{outputs['assets'].name}/{name}" not in kept:
                with contextlib.suppress(OSError):
                    found = look(path, PROBE_BYTES)
                    if found is not None and found.other is None and figures.is_ours(found.head):
                        doomed.append(path)
    removed = False
    for path in doomed:
        found = _lstat(path)
        if found is None or not stat.S_ISREG(found.st_mode):
            continue
        try:
            os.unlink(path)
            removed = True
        except OSError as exc:
            log.warning("stale_output_not_removed", path=str(path), error=str(exc))
    if removed:
        with contextlib.suppress(OSError):
            os.rmdir(outputs["assets"])  # only once empty: a user's file in it keeps it
        with contextlib.suppress(OSError):
            fsync_dir(folder)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
