"""An engine in a child process of its own (``engines.replicas.EngineSet`` puts several behind one).

Why: every vLLM replica's front end (input preparation in its processor threads, output handling on
the event loop) runs in the process that built it. With ``replicas`` in the daemon's process they
all share its GIL with rendering and the scheduler; with ``replica_processes`` (by default when
``replicas`` > 1) each replica's front end gets a process (and a GIL) of its own, and the daemon
only routes pages, which scales better with the GPUs.

The wire is a Unix socket pair (vLLM logs to stdout, so stdout cannot be it): length-prefixed
pickles of small messages. A page's pixels do not cross the socket: the daemon writes them to a file
in a private folder in one call and the child reads them in one call (a socket is written and read
in pieces, each a wait for the GIL). The child inherits the daemon's environment plus its own
(``CUDA_VISIBLE_DEVICES`` for a replica), logs to the same stderr, leads a process group of its own
(with its engine's processes: Ctrl-C and signals to the daemon's group are the daemon's to act on),
and exits when the daemon closes it or the socket; on Linux also when the daemon dies outright,
taking its group along, so neither it nor a vLLM engine core outlives the daemon.

The child builds its engine through ``engines.registry`` (the kind names the engine's entry point);
the registry never imports this module, so the two form no circle.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import pickle
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
from PIL import Image

from ocrwatch import errors
from ocrwatch.config import EngineConfig, LogConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import Images, PageRequest, Recognition
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import EngineDead, EngineFailed, OcrwatchError
from ocrwatch.infra import logging as ocw_logging
from ocrwatch.infra.memory import HeapTrimmer
from ocrwatch.pages.render import Geometry

log = structlog.get_logger()

_HEADER = struct.Struct("!I")
CLOSE_SECONDS = 120.0
"""How long ``close`` waits for a child to stop its engine (vLLM's shutdown) before it is killed."""


def _frame(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _send(writer: asyncio.StreamWriter, message: tuple[Any, ...]) -> None:
    writer.write(_frame(message))
    await writer.drain()


async def _receive(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None when the other side has gone."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        message: tuple[Any, ...] = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return message


def _error(name: str, message: str, hint: str | None) -> OcrwatchError:
    """The child's error as the same class here; anything unknown is a page-level engine failure."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, OcrwatchError):
        return cls(message, hint=hint)
    return EngineFailed(message, hint=hint)


class ProcessEngine:
    """One engine built and run by ``python -m ocrwatch.engines.process`` in a child process."""

    def __init__(
        self,
        kind: str,
        cfg: EngineConfig,
        images: Images = "placeholder",
        *,
        env: dict[str, str] | None = None,
        log_config: LogConfig | None = None,
    ) -> None:
        self.name = kind
        self.geometry = Geometry(dpi=144)  # until the child says its engine's
        self.max_concurrency = 1
        self._spec = {
            "kind": kind,
            "engine": cfg.model_dump(mode="json"),
            "images": images,
            "logging": (log_config or LogConfig()).model_dump(mode="json"),
        }
        self._env = env or {}
        self._describe: dict[str, Any] = {"name": kind}
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[Recognition]] = {}
        self._ready: asyncio.Future[tuple[Any, ...]] | None = None
        self._scratch: Path | None = None
        self._dead: str | None = None
        self._closing = False

    async def start(self) -> None:
        # a restart after close() starts afresh
        self._dead, self._closing, self._pending = (None, False, {})
        parent, child = socket.socketpair()
        self._scratch = Path(tempfile.mkdtemp(prefix="ocrwatch-engine-"))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ocrwatch.engines.process",
                str(child.fileno()),
                str(os.getpid()),
                pass_fds=(child.fileno(),),
                env={**os.environ, **self._env},
                stdin=asyncio.subprocess.DEVNULL,
                # its own process group, with its engine's processes: see main()
                start_new_session=True,
            )
        finally:
            child.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        self._ready = asyncio.get_running_loop().create_future()
        self._reader_task = asyncio.create_task(self._read(reader))
        await _send(self._writer, ("start", self._spec))
        try:
            message = await self._ready
        # a daemon stopping while a replica restarts: no child may stay behind
        except asyncio.CancelledError:
            self._kill()
            await self.close()
            raise
        if message[0] != "ready":
            await self.close()
            raise _error(*message[1:])
        _, geometry, self.max_concurrency, self._describe = message
        self.geometry = Geometry(**geometry)
        self.name = self._describe.get("name", self.name)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Resolve each page's future from the child's replies; on EOF every waiting page fails as
        dead."""
        while (message := await _receive(reader)) is not None:
            kind, *rest = message
            if kind in ("ready", "start_failed"):
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(message)
                continue
            future = self._pending.pop(rest[0], None)
            if future is None or future.done():
                continue
            if kind == "result":
                future.set_result(rest[1])
            elif kind == "cancelled":
                future.cancel()
            else:
                future.set_exception(_error(*rest[1:]))
        code = await self._proc.wait() if self._proc is not None else None
        self._dead = f"engine process exited with status {code}"
        (log.info if self._closing else log.warning)(
            "engine_process_exited", engine=self.name, status=code, pages_lost=len(self._pending)
        )
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(
                ("start_failed", "EngineDead", f"{self._dead} before it was ready", None)
            )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(EngineDead(f"{self.name}: {self._dead}"))
        self._pending.clear()

    async def recognize(self, page: PageRequest) -> Recognition:
        if self._dead is not None or self._writer is None or self._scratch is None:
            raise EngineDead(f"{self.name}: {self._dead or 'engine process is not running'}")
        image = page.image if page.image.mode not in ("P", "PA") else page.image.convert("RGBA")
        pixels = self._scratch / f"{len(self._pending)}-{time.monotonic_ns()}.raw"
        await asyncio.to_thread(pixels.write_bytes, image.tobytes())
        future: asyncio.Future[Recognition] = asyncio.get_running_loop().create_future()
        self._pending[page.request_id] = future
        try:
            # the child went while the pixels were written: nobody would answer
            if self._dead is not None:
                raise EngineDead(f"{self.name}: {self._dead}")
            await _send(
                self._writer,
                (
                    "page",
                    page.request_id,
                    str(pixels),
                    image.mode,
                    image.size,
                    page.prompt,
                    page.priority,
                    page.sampling,
                    page.page_index,
                ),
            )
            return await future
        except ConnectionError as exc:
            raise EngineDead(f"{self.name}: the engine process's socket failed: {exc}") from exc
        except asyncio.CancelledError:
            # cancelled here, not aborted by the child
            if self._pending.pop(page.request_id, None) is future:
                future.cancel()
                await self.abort(page.request_id)
            raise
        finally:
            if self._pending.get(page.request_id) is future:
                del self._pending[page.request_id]
            pixels.unlink(missing_ok=True)

    async def abort(self, request_id: str) -> None:
        if self._writer is not None and self._dead is None:
            with contextlib.suppress(ConnectionError):
                await _send(self._writer, ("abort", request_id))

    def release(self) -> None:
        if self._writer is not None and self._dead is None:
            self._writer.write(_frame(("release",)))

    async def close(self) -> None:
        proc = self._proc
        self._closing = True
        if self._writer is not None and self._dead is None:
            with contextlib.suppress(ConnectionError):
                await _send(self._writer, ("close",))
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), CLOSE_SECONDS)
            except asyncio.TimeoutError:
                log.warning("engine_process_killed", engine=self.name, after_seconds=CLOSE_SECONDS)
                self._kill()
                await proc.wait()
        if self._reader_task is not None:
            await self._reader_task
        if self._writer is not None:
            self._writer.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._dead = self._dead or "engine process closed"

    def _kill(self) -> None:
        """The child and its process group: a vLLM engine core killed with its front end would hold
        its GPU."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return self._describe


async def _serve(sock: socket.socket) -> None:
    """The child: build the engine the daemon asked for, then serve its pages until told to stop."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    message = await _receive(reader)
    if message is None or message[0] != "start":
        return
    spec = message[1]
    ocw_logging.configure(LogConfig.model_validate(spec["logging"]))
    try:
        engine = registry.build(
            EngineConfig.model_validate(spec["engine"]), spec["images"], kind=spec["kind"]
        )
        await engine.start()
    except Exception as exc:  # whatever stopped the start is the daemon's to report
        error = errors.classify(exc)
        await _send(writer, ("start_failed", type(error).__name__, error.message, error.hint))
        return
    await _send(
        writer,
        ("ready", dataclasses.asdict(engine.geometry), engine.max_concurrency, engine.describe()),
    )
    tasks: dict[str, asyncio.Task[None]] = {}
    # The daemon trims its own heap after each document; the child's front end allocates each page's
    # inputs and outputs and needs the same (without it a vLLM replica process grew by gigabytes
    # over a few hundred pages).
    trimmer = HeapTrimmer()
    trims: set[asyncio.Task[bool]] = set()

    async def page(
        request_id: str,
        path: str,
        mode: str,
        size: tuple[int, int],
        prompt: str,
        priority: int,
        sampling: Sampling,
        page_index: int,
    ) -> None:
        try:
            image = Image.frombytes(mode, size, await asyncio.to_thread(Path(path).read_bytes))
            request = PageRequest(
                request_id, image, prompt, priority, sampling=sampling, page_index=page_index
            )
            result = await engine.recognize(request)
        except asyncio.CancelledError:
            await _send(writer, ("cancelled", request_id))
        except Exception as exc:  # a page's failure goes back to the daemon, never ends the child
            error = errors.classify(exc)
            await _send(
                writer, ("error", request_id, type(error).__name__, error.message, error.hint)
            )
        else:
            await _send(writer, ("result", request_id, result))
        finally:
            tasks.pop(request_id, None)

    try:
        while (message := await _receive(reader)) is not None and message[0] != "close":
            if message[0] == "page":
                tasks[message[1]] = asyncio.create_task(page(*message[1:]))
            elif message[0] == "abort":
                await engine.abort(message[1])
            elif message[0] == "release":
                engine.release()
                trims.add(trim := asyncio.create_task(asyncio.to_thread(trimmer)))
                trim.add_done_callback(trims.discard)
    finally:
        for task in list(tasks.values()):
            task.cancel()
        await engine.close()


PR_SET_PDEATHSIG = 1


def _die_with_the_daemon(daemon: int) -> None:
    """The child notices the daemon's end on its socket only between pages, not during an engine
    start (minutes for vLLM): a daemon killed outright would leave it, and its engine core, holding
    a GPU. So Linux sends it SIGTERM when the daemon goes, and SIGTERM takes down its whole process
    group (it leads one of its own)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: _end())
    # not Linux or not glibc: the socket alone tells
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != daemon:  # gone before the request was made
        _end()


def _end() -> None:
    """This process and its group when it leads one (as ``ProcessEngine`` starts it), else this
    process alone."""
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(128 + signal.SIGTERM)


def main() -> None:
    # Ctrl-C is the daemon's to act on: it stops this child through the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_the_daemon(int(sys.argv[2]))
    asyncio.run(_serve(socket.socket(fileno=int(sys.argv[1]))))


if __name__ == "__main__":
    main()
