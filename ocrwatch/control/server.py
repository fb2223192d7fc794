"""The server end, in the daemon: the socket it serves for as long as it holds the state lock.

It answers from a ``Lifecycle`` (the daemon's state, which the daemon moves on) and from the ledger
and the pipeline it is given: nothing here holds or calls the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import structlog

from ocrwatch.config import Config
from ocrwatch.control.ocr import declines, run_ocr
from ocrwatch.control.protocol import (
    REQUEST_LIMIT,
    SOCKET_NAME,
    ControlError,
    Emit,
    OcrRequest,
    address,
)
from ocrwatch.control.status import listeners, pipeline_status, place
from ocrwatch.errors import classify
from ocrwatch.jobs.pipeline import Pipeline
from ocrwatch.sinks.local import LocalSink
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import QUEUED

log = structlog.get_logger()


class Lifecycle:
    """Where the daemon is in its life, as the control channel reads it: ``starting`` until it takes
    work with its pipeline (its engine started, its ledger's jobs being resumed), ``running``, then
    ``stopping`` once ``stopping`` (the daemon's own stop event) is set. The daemon moves it on
    (``take_work``); it holds the pipeline, never the daemon."""

    def __init__(self, stopping: asyncio.Event) -> None:
        self.pipeline: Pipeline | None = None  # once it takes work, and while it drains
        self._taking = asyncio.Event()
        self._stopping = stopping

    def take_work(self, pipeline: Pipeline) -> None:
        """``pipeline`` takes work, its ledger's jobs being resumed: from now on an ``ocr`` request
        runs at once."""
        self.pipeline = pipeline
        self._taking.set()

    def state(self) -> str:
        """``starting``, ``running`` or ``stopping``."""
        if self._stopping.is_set():
            return "stopping"
        return "running" if self._taking.is_set() else "starting"

    def taking_work(self) -> Pipeline | None:
        """The pipeline while the daemon takes work; None while it starts and once it stops."""
        return self.pipeline if self.state() == "running" else None

    async def wait_taking_work(self) -> Pipeline | None:
        """The pipeline once the daemon takes work; None when it stops first."""
        waits = [
            asyncio.create_task(self._taking.wait()),
            asyncio.create_task(self._stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        return self.taking_work()


class ControlServer:
    """The socket a daemon serves for as long as it holds the state lock. ``cfg``: the daemon's as
    it started (a reload changes its inboxes only: the listeners stay those it started with)."""

    def __init__(self, state_dir: Path, cfg: Config, ledger: AsyncLedger, life: Lifecycle) -> None:
        self.path = state_dir / SOCKET_NAME
        self._cfg = cfg
        self._ledger = ledger
        self._host = life
        self._server: asyncio.AbstractServer | None = None
        self._identity: tuple[int, int] | None = None
        self._clients: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Bind (replacing a killed daemon's socket: the caller holds the lock), make it 0600, then
        listen: nobody can connect before the mode is set. OSError when the folder cannot hold a
        socket."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with address(self.path) as where:
                sock.bind(where)
            os.chmod(self.path, 0o600)
            sock.listen(64)
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._server = await asyncio.start_unix_server(
                self._serve, sock=sock, limit=REQUEST_LIMIT
            )
        except BaseException:
            sock.close()
            raise
        log.info("control_listening", path=str(self.path))

    async def stop(self) -> None:
        """Stop listening, end the requests still open and remove the socket, if it is still this
        one."""
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
                handler = {"status": self._status, "retry": self._retry, "ocr": self._ocr}[
                    str(request.get("op"))
                ]
            except (ValueError, KeyError, TypeError) as exc:
                raise ControlError(f"not a request: {exc}") from None
            await handler(request, send, reader)
            await send({"event": "end"})
        except ConnectionError:
            pass  # the client went away; what it started was stopped (``_ocr``)
        # said to the client, in one line, rather than a connection closed without a word
        except Exception as exc:
            error = classify(exc)
            if not isinstance(exc, ControlError):
                log.error("control_request_failed", kind=error.kind, error=error.message)
            with contextlib.suppress(ConnectionError):
                await send({"event": "error", "message": error.message, "hint": error.hint})
        finally:
            self._clients.discard(task)
            writer.close()

    async def _status(
        self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader
    ) -> None:
        host = self._host
        # the jobs past queued are this daemon's running ones, not waiting
        summary = await self._ledger.summary(waiting=QUEUED)
        pipeline = host.pipeline
        engine = (
            pipeline.supervisor.kind
            if pipeline is not None and pipeline.supervisor.engine
            else None
        )
        daemon = {"pid": os.getpid(), "state": host.state(), "engine": engine}
        daemon["listening"] = listeners(self._cfg)
        live = pipeline_status(pipeline.progress() if pipeline is not None else [])
        if pipeline is not None:  # the jobs waiting in the ledger for a slot, not in memory
            waiting = await pipeline.admission.waiting_by(place, pipeline.running())
            for where, count in waiting.items():
                live["queue"].setdefault(where, {"running": 0, "waiting": 0})["waiting"] += count
        await send({"event": "status", **summary, "daemon": daemon, **live})

    async def _retry(
        self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader
    ) -> None:
        """Failed jobs back to the queue, and started now. Started by the start-up's own resume when
        the daemon is not taking work yet: the ledger was updated before it reads the queue."""
        selectors = request.get("selectors")
        if selectors is not None and not (
            isinstance(selectors, list) and all(isinstance(s, str) for s in selectors)
        ):
            raise ControlError("not a valid request: selectors must be a list of strings, or null")
        count = await self._ledger.retry(selectors or None)
        pipeline = self._host.taking_work()
        if pipeline is not None and count:
            await pipeline.resume()
        await send(
            {"event": "retried", "count": count, "pid": os.getpid(), "state": self._host.state()}
        )

    async def _ocr(self, request: dict[str, Any], send: Emit, reader: asyncio.StreamReader) -> None:
        try:
            order = OcrRequest.from_json(request)
        except ValueError as exc:
            raise ControlError(f"not a valid request: {exc}") from None
        pipeline = self._host.taking_work()
        if pipeline is None:
            if self._host.state() == "stopping":
                raise ControlError(
                    "the daemon is stopping", hint="run the command again once it has restarted"
                )
            await send(
                {
                    "event": "waiting",
                    "pid": os.getpid(),
                    "reason": "the daemon is starting its engine",
                }
            )
            pipeline = await self._host.wait_taking_work()
            if pipeline is None:
                raise ControlError("the daemon stopped before it took any work")
        reason = declines(pipeline, order)
        if reason is not None:
            await send({"event": "declined", "pid": os.getpid(), "reason": reason})
            return
        await send({"event": "accepted", "pid": os.getpid(), "engine": pipeline.supervisor.kind})
        log.info(
            "control_ocr", files=len(order.files), out=None if order.out is None else str(order.out)
        )
        sink = LocalSink(
            pipeline.cfg.output.name_template,
            order.out or pipeline.cfg.output.dir,
            written=pipeline.written,
        )
        work = asyncio.create_task(
            run_ocr(
                pipeline,
                sink,
                order.files,
                force=order.force,
                emit=send,
                lang=order.lang,
                accepting=lambda: self._host.taking_work() is not None,
                text=order.text,
            )
        )
        gone = asyncio.create_task(_closed(reader))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            # it left (Ctrl-C) or the daemon stops: its documents are stopped, not orphaned
            if not work.done():
                work.cancel()
                log.info("control_ocr_abandoned")
            await asyncio.gather(work, gone, return_exceptions=True)
        if not work.cancelled():
            work.result()


async def _closed(reader: asyncio.StreamReader) -> None:
    """Returns when the client closes its end: a request is one line, whatever follows it is
    ignored."""
    while await reader.read(65536):
        pass
