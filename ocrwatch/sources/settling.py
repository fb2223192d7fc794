"""When one file of a local inbox is whole, and its hand-over to the outbox: the deadlines' step.

``LocalSource`` watches and scans; each candidate it finds is followed here until it is closed or
stable, passes the cheap probe of ``readiness`` (or is given up on, so the renderer names its
defect), and is put in the outbox; the answer ``submit`` returns (admitted, or settled with nothing
run) is the source's own to act on (``finish``), with nothing called back meanwhile. Every stat and
probe runs in a worker thread, at most ``BLOCKING_CALLS`` at once.

Concurrency: every method is called from the event loop; ``stop`` once, after ``start``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog

from ocrwatch.errors import NotARegularFile, SourceGone, path_fault
from ocrwatch.safefs import Signature
from ocrwatch.sources.base import Answer, Job, LocalFile, Outbox, Outcome, Quarantine, key_id
from ocrwatch.sources.deadlines import Deadlines
from ocrwatch.sources.inbox import Inbox, Pending
from ocrwatch.sources.readiness import probe
from ocrwatch.sources.sourcefile import inspect

log = structlog.get_logger()

T = TypeVar("T")

PROBE_GIVE_UP_SETTLES = 10
PROBE_GIVE_UP_MIN_SECONDS = 30.0
"""A file stable this long that still fails the probe is submitted, so the renderer names its real
defect."""
RECHECK_MIN_SECONDS = 0.25
BLOCKING_CALLS = 8
"""Stats and probes in flight at once, so a scan of a big inbox leaves worker threads for the rest
of the daemon."""
SETTLE_STEPS = 32
"""Files looked at at once (a stat, a probe, or waiting for the ledger to admit them); the others
wait for their turn as an entry in one heap of deadlines, not as a task each."""
UNCHANGED_LOG_SECONDS = 60.0
"""At most this long between two lines counting files whose outcome was known already."""


Finish = Callable[[Job, Outcome, str | None], Awaitable[Quarantine | None]]
"""The source's ``finish(job, outcome, kind)``."""


def standing(outcome: Outcome, kind: str | None) -> Outcome:
    """What an outcome leaves a local file as: a failure for what its path was then (a folder on it
    swapped) is ``retry``, so the next scan that finds it whole submits it again."""
    return "retry" if outcome == "failed" and path_fault(kind) else outcome


class Settler:
    """Follows each file found in an inbox until it is whole, then puts its job in the outbox."""

    def __init__(self, source: str, finish: Finish) -> None:
        """``source``: the name the jobs carry (the source's); ``finish``: the source's own, for an
        answer that settles a job with nothing run (the move it asks goes up through the outbox)."""
        self._source = source
        self._finish = finish
        self._outbox: Outbox | None = None
        self._io = asyncio.Semaphore(BLOCKING_CALLS)
        self._deadlines: Deadlines[Pending] = Deadlines(self._check_readiness, SETTLE_STEPS)

    def start(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._deadlines.start()

    def stop(self) -> Awaitable[object]:
        """Put nothing more in the outbox: the looks in flight are cancelled before the outbox is
        let go, so none finds it gone; what is returned ends once they have ended."""
        stopped = self._deadlines.stop()
        self._outbox = None
        return stopped

    def follow(self, inbox: Inbox, path: Path, *, closed: bool, wrote: bool) -> None:
        """Follow ``path`` until it is whole; an event for a file already followed only updates
        what is known."""
        key = str(path)
        pending = inbox.pending.get(key)
        if pending is None:
            pending = inbox.pending[key] = Pending(key, inbox)
            self._deadlines.add(pending)
        pending.generation += 1
        if wrote:
            pending.reopened |= pending.closed
            pending.closed = False
        if closed:
            pending.closed = True
            self._deadlines.nudge(pending)

    def discard(self, pending: Pending) -> None:
        self._deadlines.discard(pending)

    async def _check_readiness(self, pending: Pending) -> float | None:
        """Look at one file until it is whole, then submit it: the seconds until the next look, or
        None once it is submitted or gone. A file still being written is never given up.

        Whole means: closed after writing (or moved in), or its signature (size, mtime, ctime,
        inode) unchanged for ``settle_seconds``; and then the probe passes. A close counts only for
        a new file whose writer never came back: a file rewritten, or appended by one
        open-write-close after another (an incremental PDF save), must be quiet for
        ``settle_seconds``, else each piece that ends in a valid trailer is taken. A file stable
        for long that still fails the probe is submitted anyway, so the renderer reports what is
        wrong with it.

        An empty file closed after writing and quiet for ``settle_seconds`` is submitted then (it
        fails as ``empty_file``), not after the probe's give-up: a writer that creates, closes and
        opens again has that long to begin writing, and one that comes back later has its file read
        again, its error sidecar replaced. An empty file never seen closed (a scan, a polled inbox)
        may still be held open by its writer: it is submitted once nothing has changed it (its
        ctime) for the probe's give-up, which a file found empty at a restart has long been.

        Writes do not bring the next look forward (a busy writer would make it spin); a close does;
        the next look at the settle deadline sees the writes.
        """
        inbox, path = pending.inbox, pending.path
        delay: float | None = None
        try:
            while delay is None and inbox.accepts(path):  # a reload may have changed the patterns
                generation = pending.generation
                signature: Signature | None = None
                try:
                    signature = await self.blocking(inspect, path, inbox.root)
                except SourceGone:
                    pass
                except NotARegularFile as exc:
                    self.refuse(inbox, path, exc.message)
                if signature is None or inbox.settled.matches(path, signature):
                    if pending.generation == generation:
                        break
                    continue
                delay = await self._look(pending, signature)
        except OSError as exc:
            log.warning("local_inspect_failed", path=str(path), error=str(exc))
        except Exception:  # submit failed, most likely: the reconciliation scan offers it again
            log.exception("local_settle_failed", path=str(path))
        finally:
            if delay is None and inbox.pending.get(pending.key) is pending:
                del inbox.pending[pending.key]
                self.say_unchanged(inbox)
        return delay

    async def _look(self, pending: Pending, signature: Signature) -> float | None:
        """One readiness decision: submit now (None: look once more) or how long to wait before the
        next look."""
        inbox, settle, path = pending.inbox, pending.inbox.config.settle_seconds, pending.path
        now = time.monotonic()
        if not signature.unchanged(pending.signature):
            pending.signature, pending.stable_since = signature, now
        quiet = now - pending.stable_since
        rewritten = pending.reopened or inbox.settled.submitted(path)
        give_up = max(PROBE_GIVE_UP_SETTLES * settle, PROBE_GIVE_UP_MIN_SECONDS)
        untouched = time.time() - signature.ctime_ns / 1e9
        empty = signature.size == 0 and (pending.closed or untouched >= give_up)  # none will come
        if (rewritten or empty or not pending.closed) and quiet < settle:
            return settle - quiet
        complete = not empty and await self.blocking(probe, path, inbox.root)
        if not complete and not empty and quiet < give_up:
            return max(settle, RECHECK_MIN_SECONDS)
        try:
            after = await self.blocking(inspect, path, inbox.root)
        except (SourceGone, NotARegularFile):
            return 0.0  # replaced while being probed: the next look says by what
        if not after.unchanged(signature):
            return 0.0  # it changed while being probed
        assert self._outbox is not None
        job = self.job(inbox, path, pending.detected_at)
        answer = await self._outbox.submit(job)
        known = standing(answer.settled, answer.kind) if answer.final else None
        if known != "retry":
            inbox.settled.record(path, signature)  # before finish: this version is the one judged
        if answer.final:
            await self._finished(job, answer)
        if known in ("done", "failed"):  # as it was at the last run: counted, not a line a file
            inbox.unchanged[known] += 1
            inbox.unchanged_since = inbox.unchanged_since or time.monotonic()
            return None
        log.info(
            "local_submitted",
            job_id=key_id(job.key),
            path=pending.key,
            inbox=str(inbox.root),
            bytes=signature.size,
            waited=round(time.time() - pending.detected_at, 3),
            probe="empty" if empty else "ok" if complete else "failed",
        )
        return None

    async def _finished(self, job: Job, answer: Answer) -> None:
        """``submit``'s answer settled the job with nothing run: the source's ``finish`` acts on it,
        and a document that failed before (found again by a scan, at a restart say) is set aside
        where ``finish`` asks, as a run's failure would be."""
        asked = await self._finish(job, answer.settled, answer.kind)
        if asked is not None and self._outbox is not None:
            await self._outbox.set_aside(asked)

    def say_unchanged(self, inbox: Inbox) -> None:
        """One line for the files found done or failed with the very content they had then (a
        restart finds every file done before), once nothing of the inbox is left settling, or a
        minute on."""
        if not inbox.unchanged:
            return
        if inbox.pending and time.monotonic() - inbox.unchanged_since < UNCHANGED_LOG_SECONDS:
            return
        done, failed = inbox.unchanged["done"], inbox.unchanged["failed"]
        log.info("local_unchanged", inbox=str(inbox.root), done=done, failed=failed)
        inbox.unchanged.clear()
        inbox.unchanged_since = 0.0

    def job(self, inbox: Inbox, path: Path, detected_at: float | None = None) -> Job:
        config = inbox.config
        return Job(
            origin=LocalFile(path, inbox.root),
            source=self._source,
            priority=config.priority,
            prompt=config.prompt,
            max_bytes=config.max_bytes,
            max_pages=config.max_pages,
            detected_at=detected_at or time.time(),
            duplicates=config.duplicates,
        )

    def refuse(self, inbox: Inbox, path: Path, reason: str) -> None:
        """Record ``path`` as refused for ``reason``: one log line until it is no longer refused."""
        inbox.settled.record(path, reason)
        if str(path) not in inbox.refused:
            inbox.refused.add(str(path))
            log.warning("local_refused", path=str(path), reason=reason)

    async def blocking(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a worker thread, at most ``BLOCKING_CALLS`` of them at once."""
        async with self._io:
            return await asyncio.to_thread(function, *args)
