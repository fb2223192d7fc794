"""What a source hands the daemon: a ``Job`` naming one document and how to acknowledge it.

Source contract: ``start(outbox)`` begins watching and puts every document that is ready into the
``Outbox`` with ``await outbox.submit(job)``, which returns only once the consumer (``intake``, at
the pipeline's rank) has the job durably in the ledger, so a source may acknowledge its event
(answer a webhook, keep an SQS message) after it returns. It returns its ``Answer``: admitted (to
run), or already settled as ``done``, ``failed`` or ``retry`` with nothing run, which the source
acts on itself as ``finish`` would (``Answer.final``): nothing calls the source back while it
waits. A source may put a question of its own to the layer above through the outbox (``lapsed``),
and is answered with data. A source that must give a job up without processing it (an SQS message
delivered too often) calls ``await outbox.reject(job, error, attempts)`` instead: the pipeline
writes the error sidecar through the job's sink, so sources never write sidecars themselves, then
calls ``finish(job, "failed", error.kind)``. A source holds no callable of a layer above it:
``finish`` answers a failure with data, the move it wants (``Quarantine``), which the layer above
carries out.
``stop`` stops watching; it is called once, from the event loop. ``fetch`` puts the document's
bytes in a file inside ``spool_dir``, private to the job (a local source copies its file through
one descriptor, a remote one downloads it), and says what it measured (``Fetched``); the pipeline
calls it with ``job.max_bytes`` set to the limit in force, so a source can refuse before copying,
and with what admission read of it (``Read``), so a file read under the very signature admission
hashed it under is copied without being hashed again. ``finish`` is told the final outcome of a job
that ran (or was given up), once, after the sidecars are written, and for a failure its kind
(``errors``). ``submit``'s answer ``retry``: the job was never admitted, its file not there to read
when ``submit`` looked (gone, or a folder on its path swapped), so the source looks again rather
than holding it as handed over.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from ocrwatch.config import DEFAULT_PRIORITY, S3Config
from ocrwatch.errors import OcrwatchError
from ocrwatch.safefs import Access, Signature

T = TypeVar("T")


@dataclass(frozen=True)
class LocalFile:
    path: Path
    inbox: Path

    @property
    def uri(self) -> str:
        """Not resolved: a job's ledger key must not move when a link appears on its path (a folder
        swapped for a symlink while the job waits). ``path`` is absolute and, from an inbox, free of
        links."""
        return self.path.as_uri()

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class S3Object:
    bucket: str
    key: str
    etag: str | None = None
    version_id: str | None = None
    size: int | None = None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]


Origin = LocalFile | S3Object
Outcome = Literal["done", "failed", "retry"]


@dataclass
class Job:
    origin: Origin
    source: str
    priority: int = DEFAULT_PRIORITY
    prompt: str = "markdown"
    max_bytes: int | None = None
    max_pages: int | None = None
    detected_at: float = field(default_factory=time.time)
    receipt: str | None = None
    duplicates: Literal["reuse", "ocr"] = "reuse"  # a copy of a done document takes its result

    @property
    def key(self) -> str:
        """The ledger key: one row per document location (and per S3 version where known)."""
        if isinstance(self.origin, S3Object) and self.origin.version_id:
            return f"{self.origin.uri}?versionId={self.origin.version_id}"
        return self.origin.uri


def key_id(key: str) -> str:
    """A job's short stable id for logs and temporary folders, from its ledger key (which may be
    long, or a path): hooks know a document by its key alone."""
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _unchanged() -> bool:
    return False


@dataclass(frozen=True)
class Read:
    """A local file's content as admission hashed it: its sha256 and the stat fields it was read
    under (the ledger's fingerprint). A file whose signature has these very fields holds these
    bytes: the inode and ctime cannot be set back by a user."""

    sha256: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    def holds(self, signature: Signature) -> bool:
        """Whether a file of ``signature`` (on its inbox's device) is the one that was hashed."""
        then = (self.size, self.mtime_ns, self.ctime_ns, self.inode)
        return (signature.size, signature.mtime_ns, signature.ctime_ns, signature.inode) == then


@dataclass(frozen=True)
class Fetched:
    """A document's bytes as the pipeline renders them: a file private to the job, and what was
    measured.

    ``sha256`` is the digest of exactly those bytes when the source took it while copying them
    (None: the pipeline hashes ``path``). ``changed`` (blocking) says whether the source no longer
    holds the version that was fetched, so that sidecars are never published for a version replaced
    while it was processed. ``access`` is the local file's, taken from the descriptor it was copied
    through (None: an S3 object, whose outputs follow the bucket's rules).
    """

    path: Path
    sha256: str | None = None
    changed: Callable[[], bool] = _unchanged
    access: Access | None = None


@dataclass(frozen=True)
class Answer:
    """What ``submit`` says of a job: ``admitted`` (it waits in the ledger and runs), or, with
    nothing run, ``done`` or ``failed`` as the ledger or its sidecars hold it (``kind``: the
    failure's), or ``retry`` (its file was not there to read: look again)."""

    outcome: Literal["admitted", "done", "failed", "retry"]
    kind: str | None = None

    @property
    def final(self) -> bool:
        """Whether the answer ends the job's event as ``finish`` would (nothing runs)."""
        return self.outcome != "admitted"

    @property
    def settled(self) -> Outcome:
        """The outcome a final answer gives the source (``finish``'s)."""
        assert self.outcome != "admitted", "an admitted job's outcome comes once it ran"
        return self.outcome


ADMITTED = Answer("admitted")


@dataclass(frozen=True)
class Quarantine:
    """A failed local document its source sets aside (``finish``'s answer): ``path``, beneath the
    inbox ``root``, goes to the same place under ``to`` (the inbox's ``quarantine_dir``), its error
    sidecar named by ``name_template``. Data, not a call: the layer above, which holds the record of
    outputs, moves it and judges whether the error sidecar is ocrwatch's to take along."""

    path: Path
    root: Path
    to: Path
    name_template: str


Submit = Callable[[Job], Awaitable[Answer]]
Reject = Callable[[Job, OcrwatchError, int], Awaitable[None]]
"""``reject(job, error, attempts)``: give the job up as failed with ``error`` after ``attempts``
tries."""


SetsAside = Callable[[Quarantine], Awaitable[None]]
"""``set_aside(request)``: carry out a source's ``Quarantine`` (asked through
``Outbox.set_aside``)."""

Lapsed = Callable[[list[Job]], Awaitable[list[Job]]]
"""``lapsed(jobs)``: those of ``jobs`` the ledger holds as done whose sidecars are gone since, or
no longer their own (the layer above's word, asked through ``Outbox.lapsed``)."""


@dataclass(eq=False)
class Handoff:
    """One job put into an ``Outbox``: to admit (``error`` None) or to give up after
    ``attempts`` tries; ``answered`` resolves once the consumer has dealt with it (with
    ``submit``'s answer, None for a job given up)."""

    job: Job
    error: OcrwatchError | None
    attempts: int
    answered: asyncio.Future[Answer | None]

    def answer(self, exc: BaseException | None = None, said: Answer | None = None) -> None:
        """The consumer's answer: the source's ``submit`` returns ``said`` (``reject`` returns), or
        raises ``exc``."""
        _resolve(self.answered, said, exc)


@dataclass(eq=False)
class Question:
    """Which of ``jobs`` lapsed, put into an ``Outbox`` for the layer above to answer:
    ``answered`` resolves with those that did."""

    jobs: list[Job]
    answered: asyncio.Future[list[Job]]

    def answer(self, exc: BaseException | None = None, said: list[Job] | None = None) -> None:
        """The consumer's answer (``said``), or what it raised."""
        _resolve(self.answered, said or [], exc)


@dataclass(eq=False)
class SetAside:
    """A failed document its source asks the layer above to set aside (``request``), put into an
    ``Outbox`` where no run will (its ``submit`` was answered ``failed``): ``answered`` resolves
    once the move was tried."""

    request: Quarantine
    answered: asyncio.Future[None]

    def answer(self, exc: BaseException | None = None, said: None = None) -> None:
        """The consumer is done with it, or what it raised."""
        _resolve(self.answered, None, exc)


def _resolve(future: asyncio.Future[T], result: T, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


class Outbox:
    """Where sources put the jobs they produce, for the layer above to take: the source returns
    jobs rather than calling into the pipeline. Each put waits for its answer, so the source
    acknowledges an event only once the job is durably admitted."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Handoff | Question | SetAside] = asyncio.Queue()

    async def submit(self, job: Job) -> Answer:
        """Put ``job`` in to be admitted; returns once it is in the ledger, or known settled: what
        became of it (``Answer``)."""
        answer = await self._put(job, None, 0)
        assert answer is not None
        return answer

    async def reject(self, job: Job, error: OcrwatchError, attempts: int) -> None:
        """Put ``job`` in to be given up as failed with ``error`` after ``attempts`` tries."""
        await self._put(job, error, attempts)

    async def lapsed(self, jobs: list[Job]) -> list[Job]:
        """Those of ``jobs``, each submitted before, whose sidecars lapsed since (the layer above
        decides, from the ledger and the sinks): the source submits them again."""
        question = Question(jobs, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(question)
        return await question.answered

    async def set_aside(self, request: Quarantine) -> None:
        """Put in the move a failed document's source asks for where no run of it will
        (``finish``'s answer to ``submit``'s ``failed``); returns once it was tried."""
        asked = SetAside(request, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(asked)
        await asked.answered

    async def _put(self, job: Job, error: OcrwatchError | None, attempts: int) -> Answer | None:
        delivery = Handoff(job, error, attempts, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(delivery)
        return await delivery.answered

    async def get(self) -> Handoff | Question | SetAside:
        """The next job or question a source put in (the consumer's side)."""
        return await self._queue.get()


@runtime_checkable
class Source(Protocol):
    name: str

    async def start(self, outbox: Outbox) -> None:
        """Begin watching; put each ready document into ``outbox`` (or reject one given up)."""

    async def stop(self) -> None:
        """Stop watching; pending events may be dropped (a later scan or redelivery finds them)."""

    async def fetch(self, job: Job, spool_dir: Path, read: Read | None = None) -> Fetched:
        """Put the document's bytes in a file inside ``spool_dir`` and say what was measured reading
        them; ``read``: what admission read of it, where it hashed it."""

    async def finish(
        self, job: Job, outcome: Outcome, kind: str | None = None
    ) -> Quarantine | None:
        """Acknowledge the job's event now that its sidecars are written (or it is given up as
        ``kind``). For a failure, the move the source asks of the layer above (``Quarantine``: its
        document set aside, done by ``jobs.quarantine``), or None."""


@runtime_checkable
class Bucketed(Protocol):
    """A source that reads a bucket: its S3 client and its ``[[s3]]`` table, which the on-success
    action uses. A protocol, so that code beside a local source never imports boto3."""

    client: Any
    cfg: S3Config
