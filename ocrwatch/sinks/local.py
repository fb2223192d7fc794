"""Sidecars beside a local source (or mirrored under ``[output] dir``), written atomically.

Each file is written to a hidden temporary name in the destination folder, flushed, fsynced and renamed over
the final name, then the folder is fsynced: a reader sees the old file or the new one, never half of one,
even across ``kill -9`` or a full disk. The JSON goes last, so its presence means the Markdown is complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ocrwatch.errors import OutputNotWritable
from ocrwatch.sinks.base import sidecar_names
from ocrwatch.sources.base import Job, LocalFile

TMP_MARKER = ".ocrwatch-tmp-"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either absent, the old content or all of ``data``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:80]}{TMP_MARKER}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dump_json(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


class LocalSink:
    """Writes ``NAME.md`` / ``NAME.json`` / ``NAME.error.json`` beside the source file."""

    def __init__(self, name_template: str = "{name}", out_dir: Path | None = None) -> None:
        self._template = name_template
        self._out_dir = out_dir

    def paths(self, job: Job) -> dict[str, Path]:
        origin = job.origin
        if not isinstance(origin, LocalFile):
            raise TypeError(f"LocalSink cannot write sidecars for {origin.uri}")
        folder = origin.path.parent
        if self._out_dir is not None:
            try:
                relative = origin.path.parent.relative_to(origin.inbox)
            except ValueError:
                relative = Path()
            folder = self._out_dir / relative
        return {kind: folder / name for kind, name in sidecar_names(origin.path.name, self._template).items()}

    def recorded(self, job: Job) -> dict[str, Any] | None:
        try:
            data = json.loads(self.paths(job)["json"].read_bytes())
        except (OSError, ValueError):
            return None
        source = data.get("source") if isinstance(data, dict) else None
        return source if isinstance(source, dict) else None

    def write(self, job: Job, markdown: str, document: dict[str, Any]) -> None:
        paths = self.paths(job)
        self._prepare(paths["json"].parent)
        atomic_write(paths["md"], markdown.encode("utf-8"))
        atomic_write(paths["json"], dump_json(document))
        try:
            paths["error"].unlink()
        except FileNotFoundError:
            pass

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        path = self.paths(job)["error"]
        self._prepare(path.parent)
        atomic_write(path, dump_json(error))

    def _prepare(self, folder: Path) -> None:
        if self._out_dir is not None:
            folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputNotWritable(f"cannot write sidecars in {folder}: permission denied")
