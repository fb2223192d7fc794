"""The daemon's control channel: ``ocrwatch status``, ``retry`` and ``ocr`` talk to the running daemon.

A running daemon listens on a Unix socket in ``state_dir`` (``control.sock``, mode 0600, so only the user it runs
as, and root, can connect). A connection carries one request, a JSON object on one line (``{"op": "status"}``,
``{"op": "retry", "selectors": [...]}``, ``{"op": "ocr", "files": [...], ...}``); the answer is JSON lines,
streamed while the request runs (an ``ocr`` request's page progress and each file's result), the last one
``{"event": "end"}``. This is not ``ocrwatch.http``'s job: that layer serves HTTP over TCP to whoever reaches a
port (metrics, health, the S3 webhook); this channel is local, owner-only by its file mode, and streams lines
to one waiting command.

The state lock (``daemon.lock``, held with ``flock`` for the daemon's whole life) is the authority on whether a
daemon runs: a client asks the socket only while the lock is held, and a daemon removes the socket file a killed
predecessor left behind, since holding the lock proves nobody serves it.

``run_ocr`` is what an ``ocr`` request does, in the daemon or, when none runs, in the ``ocrwatch ocr`` process
itself with an engine of its own: its events are the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import json
import os
import socket
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, get_args

import structlog

from ocrwatch.config import Config
from ocrwatch.config import TextMode
from ocrwatch.errors import ConfigError, TransientError, classify
from ocrwatch.ledger import Fingerprint, Ledger
from ocrwatch.pipeline import Pipeline, Progress
from ocrwatch.safefs import hash_fd
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile, S3Object
from ocrwatch.sources.files import GivenFiles
from ocrwatch.written import Written

log = structlog.get_logger()

SOCKET_NAME = "control.sock"
LOCK_NAME = "daemon.lock"
SUN_PATH_MAX = 108
"""Bytes in ``sockaddr_un.sun_path``, its final NUL included."""
REQUEST_LIMIT = 64 * 1024 * 1024
"""The longest request line: an ``ocr DIR`` request names every file found."""
PROGRESS_SECONDS = 0.5
CONNECT_SECONDS = 5.0
"""How long a client waits for a daemon that holds the lock to answer (it binds the socket right after locking)."""
REQUEST_PREFIX = "cli:"
"""Source names of ``ocr`` requests: one source per request, so each has its own output folder."""

Emit = Callable[[dict[str, Any]], Awaitable[None]]
_requests = itertools.count(1)


class ControlError(TransientError):
    """The daemon holding the state did not answer, or refused a request."""

    kind = "control_error"
    hint = "look at the daemon's log (journalctl -u ocrwatch), then try again"


# --- files, as an ``ocr`` request names them ----------------------------------------------------------------


@dataclass(frozen=True)
class OcrRequest:
    """Files to OCR, each with the folder it was found under (mirrored below ``out``), and how."""

    files: list[tuple[Path, Path]]
    out: Path | None = None
    force: bool = False
    engine: str | None = None  # the engine the user asked for; None: whichever runs
    lang: str | None = None  # Tesseract's language, when the user asked for one
    text: TextMode | None = None  # ``--text``: where the pages' text comes from; None: the inbox's

    def as_json(self) -> dict[str, Any]:
        return {
            "op": "ocr", "files": [[str(path), str(root)] for path, root in self.files],
            "out": None if self.out is None else str(self.out), "force": self.force, "engine": self.engine,
            "lang": self.lang, "text": self.text,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OcrRequest:
        """The request a client sent; ValueError for one that does not have this shape."""
        files = data.get("files")
        if not isinstance(files, list) or not all(isinstance(f, list) and len(f) == 2 for f in files):
            raise ValueError("files: a list of [path, root] pairs")
        out, engine, lang = data.get("out"), data.get("engine"), data.get("lang")
        if not all(value is None or isinstance(value, str) for value in (out, engine, lang)):
            raise ValueError("out, engine and lang: strings or null")
        if (text := data.get("text")) not in (None, *get_args(TextMode)):
            raise ValueError(f"text: one of {', '.join(get_args(TextMode))} or null")
        return cls(
            [(Path(str(path)), Path(str(root))) for path, root in files], None if out is None else Path(out),
            bool(data.get("force")), engine, lang, text,
        )  # fmt: skip


async def run_ocr(
    pipeline: Pipeline, sink: LocalSink, files: list[tuple[Path, Path]], *, force: bool, emit: Emit,
    lang: str | None = None, before_first: Callable[[], Awaitable[None]] | None = None,
    accepting: Callable[[], bool] = lambda: True, text: TextMode | None = None,
) -> None:  # fmt: skip
    """OCR ``files`` through ``pipeline`` without the ledger, emitting each file's page progress and result.

    A file whose JSON sidecar records its very content is skipped unless ``force``; ``lang``: Tesseract's
    languages for these files, ``text``: where their pages' text comes from. ``before_first``
    runs once, before the first job starts (a CLI's own engine is started only when something is left to do);
    ``accepting`` turns False when the daemon stops, and the files not started yet are reported interrupted.
    Cancelled (the client went away), it stops the jobs it started and returns once they have ended."""
    name = f"{REQUEST_PREFIX}{next(_requests)}"
    source = GivenFiles([path for path, _ in files])
    source.name = name
    pipeline.add_source(source, sink)
    waiting: dict[asyncio.Task[str], Job] = {}
    shown: dict[str, tuple[int, int]] = {}

    async def admit() -> None:
        started = False
        for path, root in files:
            job = Job(origin=LocalFile(path, root), source=name)
            if not force and await asyncio.to_thread(_current, pipeline, sink, job):
                await emit({"event": "result", "file": str(path), "status": "skipped"})
                continue
            if not started and before_first is not None:
                await before_first()
            started = True
            if not accepting():
                await emit(_interrupted(path))
                continue
            waiting[pipeline.start_job(job, record=False, lang=lang, text=text)] = job

    admitting = asyncio.create_task(admit(), name=f"ocr-admit:{name}")
    try:
        while not admitting.done() or waiting:
            await asyncio.wait({admitting, *waiting}, timeout=PROGRESS_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            if admitting.done():
                admitting.result()  # raises what stopped it (a file that cannot be checked, an engine that failed)
            await _emit_progress(pipeline, waiting, shown, emit)
            for task in [task for task in waiting if task.done()]:
                job = waiting.pop(task)
                done, total = shown.pop(job.key, (0, 0))
                if done < total and not task.cancelled() and task.result() != "failed":
                    await emit(_progress(job, total, total))  # its last pages finished between two looks
                await emit(await _outcome(sink, job, task))
    finally:
        admitting.cancel()
        mine = {p.job.key for p in pipeline.progress() if p.job.source == name}
        stopping = [task for task, job in waiting.items() if job.key in mine]
        for task in stopping:
            task.cancel()
        await asyncio.gather(admitting, *stopping, return_exceptions=True)
        del pipeline.sources[name], pipeline.sinks[name]  # none of its jobs runs any more


def _current(pipeline: Pipeline, sink: LocalSink, job: Job) -> bool:
    """Whether the job's JSON sidecar records its content now (blocking: hashes the file, when a sidecar is
    there to compare with). Anything that is not a regular file is left to the pipeline, which names what it is;
    it is never read here (a FIFO would block)."""
    assert isinstance(job.origin, LocalFile)
    if sink.recorded(job) is None:
        return False
    try:
        fd = os.open(job.origin.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        digest = hash_fd(fd)
    finally:
        os.close(fd)
    fingerprint = Fingerprint(size=info.st_size, mtime_ns=info.st_mtime_ns, sha256=digest)
    return pipeline.already_written(job, fingerprint)


async def _emit_progress(
    pipeline: Pipeline, waiting: dict[asyncio.Task[str], Job], shown: dict[str, tuple[int, int]], emit: Emit
) -> None:
    by_key = {p.job.key: p for p in pipeline.progress()}
    for job in waiting.values():
        now = by_key.get(job.key)
        if now is None or now.pages_total is None or shown.get(job.key) == (now.pages_done, now.pages_total):
            continue
        shown[job.key] = (now.pages_done, now.pages_total)
        await emit(_progress(job, now.pages_done, now.pages_total))


async def _outcome(sink: LocalSink, job: Job, task: asyncio.Task[str]) -> dict[str, Any]:
    assert isinstance(job.origin, LocalFile)
    if task.cancelled():
        return _interrupted(job.origin.path)
    status = task.result()
    error = await asyncio.to_thread(_recorded_error, sink, job) if status == "failed" else None
    return {"event": "result", "file": str(job.origin.path), "status": status, "error": error}


def _progress(job: Job, done: int, total: int) -> dict[str, Any]:
    assert isinstance(job.origin, LocalFile)
    return {"event": "progress", "file": str(job.origin.path), "pages_done": done, "pages_total": total}


def _interrupted(path: Path) -> dict[str, Any]:
    error = {"kind": "interrupted", "message": "the daemon stopped before it was done", "hint": "run it again"}
    return {"event": "result", "file": str(path), "status": "interrupted", "error": error}


def _recorded_error(sink: LocalSink, job: Job) -> dict[str, Any]:
    """The kind, message and hint of a failure, as its error sidecar records them."""
    try:
        error = json.loads(sink.paths(job)["error"].read_text())["error"]
        return {key: error[key] for key in ("kind", "message", "hint")}
    except (OSError, ValueError, KeyError, TypeError):
        return {"kind": "failed", "message": "no error sidecar could be read", "hint": "see the log"}


# --- status -----------------------------------------------------------------------------------------------


def place(job: Job) -> str:
    """Where a job waits, as ``ocrwatch status`` groups the queue: its inbox, its bucket, or ``ocrwatch ocr``."""
    origin = job.origin
    if isinstance(origin, S3Object):
        return f"s3://{origin.bucket}"
    if job.source.startswith(REQUEST_PREFIX):
        return "ocrwatch ocr"
    return str(origin.inbox)


def ledger_status(ledger: Ledger) -> dict[str, Any]:
    """What ``ocrwatch status`` shows with no daemon running (blocking): the ledger's summary, and its unfinished
    jobs by inbox, all waiting for the next start."""
    queue: Counter[str] = Counter(place(row.job) for row in ledger.unfinished())
    return ledger.summary() | {
        "daemon": None, "documents": [], "queue": {where: {"running": 0, "waiting": n} for where, n in queue.items()},
    }  # fmt: skip


def pipeline_status(progress: list[Progress]) -> dict[str, Any]:
    """The running documents with their pages, and the queue by inbox, as a running daemon holds them."""
    queue: dict[str, dict[str, int]] = {}
    for p in progress:
        counts = queue.setdefault(place(p.job), {"running": 0, "waiting": 0})
        counts["running" if p.running else "waiting"] += 1
    documents = [
        {"uri": p.job.origin.uri, "pages_done": p.pages_done, "pages_total": p.pages_total,
         "eta_seconds": None if p.eta_seconds is None else round(p.eta_seconds, 1)}
        for p in sorted(progress, key=lambda p: p.job.detected_at) if p.running
    ]  # fmt: skip
    return {"documents": documents, "queue": queue}


def listeners(cfg: Config) -> dict[str, str]:
    """The TCP addresses a daemon of ``cfg`` listens on, by the key that sets each: ``check`` binds
    them, and a running daemon names them in its status, so ``check`` tells its ports from a
    stranger's."""
    found = {"[metrics] listen": cfg.metrics.listen} if cfg.metrics.enabled else {}
    for index, s3 in enumerate(cfg.s3):
        if s3.transport == "webhook":
            found[f"s3[{index}].listen"] = s3.listen
    return found


# --- the server, in the daemon ----------------------------------------------------------------------------


class Host(Protocol):
    """What the control channel needs of the daemon."""

    cfg: Config  # a reload changes its inboxes only: the listeners stay those it started with
    ledger: Ledger | None
    pipeline: Pipeline | None

    def state(self) -> str:
        """``starting``, ``running`` or ``stopping``."""

    def taking_work(self) -> Pipeline | None:
        """The pipeline while the daemon takes work; None while it starts and once it stops."""

    async def wait_taking_work(self) -> Pipeline | None:
        """The pipeline once the daemon takes work; None when it stops first."""

    async def resume(self) -> int:
        """Start every unfinished job of the ledger that does not run yet; how many."""


class ControlServer:
    """The socket a daemon serves for as long as it holds the state lock."""

    def __init__(self, state_dir: Path, host: Host) -> None:
        self.path = state_dir / SOCKET_NAME
        self._host = host
        self._server: asyncio.AbstractServer | None = None
        self._identity: tuple[int, int] | None = None
        self._clients: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Bind (replacing a killed daemon's socket: the caller holds the lock), make it 0600, then listen:
        nobody can connect before the mode is set. OSError when the folder cannot hold a socket."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _address(self.path) as address:
                sock.bind(address)
            os.chmod(self.path, 0o600)
            sock.listen(64)
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=REQUEST_LIMIT)
        except BaseException:
            sock.close()
            raise
        log.info("control_listening", path=str(self.path))

    async def stop(self) -> None:
        """Stop listening, end the requests still open and remove the socket, if it is still this one."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        with contextlib.suppress(OSError):
            info = os.stat(self.path)
            if (info.st_dev, info.st_ino) == self._identity:
                os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)

        async def send(event: dict[str, Any]) -> None:
            writer.write(json.dumps(event).encode() + b"\n")
            await writer.drain()

        try:
            try:
                request = json.loads(await reader.readline())
                if not isinstance(request, dict):
                    raise ValueError("not a JSON object")
                handler = {"status": self._status, "retry": self._retry, "ocr": self._ocr}[request.get("op")]
            except (ValueError, KeyError, TypeError) as exc:
                raise ControlError(f"not a request: {exc}") from None
            await handler(request, send, reader)
            await send({"event": "end"})
        except ConnectionError:
            pass  # the client went away; what it started was stopped (``_ocr``)
        except Exception as exc:  # said to the client, in one line, rather than a connection closed without a word
            error = classify(exc)
            if not isinstance(exc, ControlError):
                log.error("control_request_failed", kind=error.kind, error=error.message)
            with contextlib.suppress(ConnectionError):
                await send({"event": "error", "message": error.message, "hint": error.hint})
        finally:
            self._clients.discard(task)
            writer.close()

    async def _status(self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader) -> None:
        host = self._host
        summary = await asyncio.to_thread(host.ledger.summary) if host.ledger is not None else {}
        pipeline = host.pipeline
        engine = pipeline.supervisor.kind if pipeline is not None and pipeline.supervisor.engine else None
        daemon = {"pid": os.getpid(), "state": host.state(), "engine": engine}
        daemon["listening"] = listeners(host.cfg)
        live = pipeline_status(pipeline.progress() if pipeline is not None else [])
        if pipeline is not None:  # the jobs waiting in the ledger for a slot, not in memory
            waiting = await pipeline.admission.waiting_by(place, pipeline.running())
            for where, count in waiting.items():
                live["queue"].setdefault(where, {"running": 0, "waiting": 0})["waiting"] += count
        await send({"event": "status", **summary, "daemon": daemon, **live})

    async def _retry(self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader) -> None:
        """Failed jobs back to the queue, and started now. Started by the start-up's own resume when the
        daemon is not taking work yet: the ledger was updated before it reads the queue."""
        selectors = request.get("selectors")
        if selectors is not None and not (isinstance(selectors, list) and all(isinstance(s, str) for s in selectors)):
            raise ControlError("not a valid request: selectors must be a list of strings, or null")
        ledger = self._host.ledger
        if ledger is None:
            raise ControlError("the daemon has no ledger open")
        count = await asyncio.to_thread(ledger.retry, selectors or None)
        started = self._host.taking_work() is not None
        if started and count:
            await self._host.resume()
        await send({"event": "retried", "count": count, "pid": os.getpid(), "state": self._host.state()})

    async def _ocr(self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader) -> None:
        try:
            order = OcrRequest.from_json(request)
        except ValueError as exc:
            raise ControlError(f"not a valid request: {exc}") from None
        pipeline = self._host.taking_work()
        if pipeline is None:
            if self._host.state() == "stopping":
                raise ControlError("the daemon is stopping", hint="run the command again once it has restarted")
            await send({"event": "waiting", "pid": os.getpid(), "reason": "the daemon is starting its engine"})
            pipeline = await self._host.wait_taking_work()
            if pipeline is None:
                raise ControlError("the daemon stopped before it took any work")
        reason = declines(pipeline, order)
        if reason is not None:
            await send({"event": "declined", "pid": os.getpid(), "reason": reason})
            return
        await send({"event": "accepted", "pid": os.getpid(), "engine": pipeline.supervisor.kind})
        log.info("control_ocr", files=len(order.files), out=None if order.out is None else str(order.out))
        written = Written(pipeline.ledger) if pipeline.ledger is not None else None
        sink = LocalSink(pipeline.cfg.output.name_template, order.out or pipeline.cfg.output.dir, written=written)
        work = asyncio.create_task(run_ocr(
            pipeline, sink, order.files, force=order.force, emit=send, lang=order.lang,
            accepting=lambda: self._host.taking_work() is not None, text=order.text,
        ))  # fmt: skip
        gone = asyncio.create_task(_closed(reader))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():  # it left (Ctrl-C) or the daemon stops: its documents are stopped, not orphaned
                work.cancel()
                log.info("control_ocr_abandoned")
            await asyncio.gather(work, gone, return_exceptions=True)
        if not work.cancelled():
            work.result()


async def _closed(reader: asyncio.StreamReader) -> None:
    """Returns when the client closes its end: a request is one line, whatever follows it is ignored."""
    while await reader.read(65536):
        pass


def declines(pipeline: Pipeline, order: OcrRequest) -> str | None:
    """Why the daemon's engine cannot serve a request (another engine asked for: ``--lang`` asks for
    Tesseract); None when it can. The client then reads the files with an engine of its own, which never means
    a second vLLM engine beside the daemon's: it is declined only for an engine the daemon does not run."""
    running = pipeline.supervisor.kind
    if order.engine is not None and order.engine != running:
        return f"the running daemon reads with {running}, not {order.engine}"
    return None


# --- the client, in the CLI -----------------------------------------------------------------------------------


def daemon_holds(state_dir: Path) -> bool:
    """Whether a daemon holds ``state_dir``'s lock now. Probed with a shared lock held for an instant (a daemon
    starting meanwhile retries its own for a while)."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(
            f"state_dir: {path} cannot be read: {exc.strerror}",
            hint=f"run as the user ocrwatch runs as, or make {state_dir} readable",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


class Client:
    """One connection to the running daemon, for one request."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def connect(cls, state_dir: Path, *, wait: float = CONNECT_SECONDS) -> Client | None:
        """A connection to the daemon holding ``state_dir``; None when none holds it. ControlError when one holds
        it but does not answer within ``wait`` seconds (stopping, or hung)."""
        path = state_dir / SOCKET_NAME
        deadline = time.monotonic() + wait
        while True:
            if not daemon_holds(state_dir):
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with _address(path) as address:
                    sock.connect(address)
                return cls(sock)
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN):
                    raise ControlError(
                        f"cannot connect to the daemon's control socket {path}: {exc.strerror}",
                        hint="run as the user the daemon runs as",
                    ) from None
            if time.monotonic() > deadline:
                raise ControlError(
                    f"a daemon holds {state_dir} but does not answer on {path}",
                    hint="it may be stopping: wait for it, or look at its log (journalctl -u ocrwatch)",
                )
            time.sleep(0.1)

    def request(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Send ``payload``; yield each event the daemon answers, up to ``end`` (not included). An ``error``
        event raises ControlError, as does a connection that ends before ``end``."""
        try:
            self._sock.sendall(json.dumps(payload).encode() + b"\n")
            with self._sock.makefile("rb") as lines:
                for line in lines:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise ControlError(f"the daemon answered something else than JSON: {line[:80]!r}") from None
                    if event.get("event") == "end":
                        return
                    if event.get("event") == "error":
                        raise ControlError(f"the daemon refused: {event.get('message')}", hint=event.get("hint"))
                    yield event
        except OSError as exc:
            raise ControlError(f"the connection to the daemon failed: {exc}") from None
        finally:
            self._sock.close()
        raise ControlError("the daemon closed the connection before it was done (it stopped?)")


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """``path`` as an AF_UNIX address. ``sun_path`` holds 107 bytes; a deeper state_dir is reached through a
    descriptor of its folder (``/proc/self/fd/N/control.sock``), which Linux resolves like any other path."""
    if len(os.fsencode(path)) < SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
