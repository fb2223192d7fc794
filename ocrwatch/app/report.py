"""What ``ocrwatch ocr`` prints while it runs: on a terminal one bar for the whole run (pages done
of the pages known so far, pages a second, the time left), elsewhere one line per page step, as a
log reader wants (JSON events, ``ocr_progress`` and ``ocr_failed``, where the log lines are JSON);
each failure with its kind and hint on stderr, and a summary on stdout at the end. While the bar is
shown, every other line on stderr (a log line, the command's own) is written above it."""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from tqdm import tqdm

from ocrwatch.infra.logging import bar_shown, say


class OcrReport:
    """Takes the ``progress`` and ``result`` events of an ``ocr`` run (from this process or a
    daemon)."""

    def __init__(self, files: int, bar: bool | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self._pages: dict[str, tuple[int, int]] = {}  # file -> (done, total)
        on_terminal = sys.stderr.isatty() if bar is None else bar
        self._bar = (
            tqdm(
                total=0,
                unit="page",
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0.1,
                desc=f"0/{files} files",
            )
            if on_terminal
            else None
        )
        self._files = files
        bar_shown(self._bar is not None)

    async def emit(self, event: dict[str, Any]) -> None:
        self.show(event)

    def show(self, event: dict[str, Any]) -> None:
        name = shown(str(event.get("file")))
        if event.get("event") == "progress":
            self._progress(name, int(event["pages_done"]), int(event["pages_total"]))
        elif event.get("event") == "result":
            self.counts[event["status"]] += 1
            if self._bar is not None:
                self._bar.set_description(f"{sum(self.counts.values())}/{self._files} files")
            if error := event.get("error"):
                kind, hint = error["kind"], error["hint"]
                text = f"ocrwatch: {name}: {kind}: {error['message']} (hint: {hint})"
                self._say(text, file=name, kind=kind, hint=hint)

    def _progress(self, name: str, done: int, total: int) -> None:
        if self._bar is None:
            text = f"ocrwatch: {name}: {done}/{total} pages"
            say(text, "info", "ocr_progress", file=name, pages_done=done, pages_total=total)
            return
        before_done, before_total = self._pages.get(name, (0, 0))
        self._pages[name] = (done, total)
        if total != before_total:
            self._bar.total = sum(known for _, known in self._pages.values())
            self._bar.refresh()
        self._bar.update(done - before_done)

    def _say(self, text: str, **fields: Any) -> None:
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            say(text, "error", "ocr_failed", **fields)

    def finish(self, error: str | None = None) -> bool:
        """Print the summary, after ``error`` where one stopped the run (an engine that could not
        start); whether any file failed, was left unfinished, or was never read."""
        if error is not None:
            self._say(error)
        if self._bar is not None:
            self._bar.close()
            bar_shown(False)
        counts = self.counts
        partial = f" ({counts['partial']} partial)" if counts["partial"] else ""
        failed = counts["failed"] + counts["interrupted"]
        unread = self._files - sum(counts.values())
        print(
            f"{counts['ok'] + counts['partial']} done{partial}, {counts['skipped']} skipped, "
            f"{failed} failed" + (f", {unread} not read" if unread > 0 else "")
        )
        return failed > 0 or unread > 0


def shown(path: str) -> str:
    """A path as the user would type it here: relative below the working directory, else
    absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
