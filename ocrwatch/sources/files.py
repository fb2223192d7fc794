"""The files named on the command line (``ocrwatch ocr FILE...``) as a source: no watching, no settling."""

from __future__ import annotations

from pathlib import Path

from ocrwatch.config import DEFAULT_PRIORITY
from ocrwatch.sources.base import Job, LocalFile, Outcome, Reject, Submit


class GivenFiles:
    """A ``Source`` over a fixed list of files; ``ocrwatch ocr`` starts its jobs itself, from ``jobs()``."""

    name = "cli"

    def __init__(self, paths: list[Path], *, prompt: str = "markdown", priority: int = DEFAULT_PRIORITY) -> None:
        self._paths = [path.absolute() for path in paths]
        self._prompt = prompt
        self._priority = priority

    def jobs(self) -> list[Job]:
        return [
            Job(origin=LocalFile(path, path.parent), source=self.name, priority=self._priority, prompt=self._prompt)
            for path in self._paths
        ]

    async def start(self, submit: Submit, reject: Reject) -> None:
        for job in self.jobs():
            await submit(job)

    async def stop(self) -> None:
        return None

    async def fetch(self, job: Job, spool_dir: Path) -> Path:
        assert isinstance(job.origin, LocalFile)
        return job.origin.path

    async def finish(self, job: Job, outcome: Outcome) -> None:
        return None
