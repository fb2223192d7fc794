"""The daemon's life cycle: ``startup`` → ``main_loop`` → ``shutdown``, as gunicorn's arbiter runs
its own.

Start-up locks the state directory, opens the control socket (``control``: ``ocrwatch status``,
``retry`` and ``ocr`` talk to the daemon through it), resumes what the ledger left unfinished,
composes the sources with their sinks and tells systemd it is ready. Signal handlers only set
events; the main loop and the shutdown act on them: SIGTERM or SIGINT drains and stops, SIGHUP
reloads the inboxes, and a second SIGINT exits at once. A document's own steps live in ``pipeline``;
the engine's supervision in ``supervisor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import IO, Any

import structlog
import tenacity

import ocrwatch.config.roots as roots
from ocrwatch import config as config_module
from ocrwatch.app import checks
from ocrwatch.config import Config
from ocrwatch.control.protocol import LOCK_NAME
from ocrwatch.control.server import ControlServer, Lifecycle
from ocrwatch.errors import ConfigError, OcrwatchError
from ocrwatch.infra.metrics import HealthServer, LoopLagProbe, Metrics, gpu_memory_used
from ocrwatch.infra.systemd import sd_notify, watchdog_interval
from ocrwatch.jobs import intake
from ocrwatch.jobs.pipeline import Pipeline
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Outbox
from ocrwatch.sources.local import LocalSource
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.database import open_private
from ocrwatch.store.ledger import Ledger, StateUnusable, make_private_dirs

log = structlog.get_logger()

FORCED_EXIT_CODE = 130  # as a shell reports a process ended by SIGINT
# What the user must fix before a start can succeed (a broken ledger, a read-only state_dir, a
# second daemon): the unit's RestartPreventExitStatus names it, so systemd does not restart into the
# same error.
USAGE_EXIT_CODE = 2
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SignalCatcher:
    """Catches ``SIGNALS`` with a Python-level handler that schedules ``handle`` on the loop.

    Not ``loop.add_signal_handler``: asyncio learns of such a signal only from the byte Python
    writes to the loop's self-pipe, the pipe every ``call_soon_threadsafe`` writes to as well, and
    when threads fill it the byte is dropped ("Exception ignored when trying to write to the signal
    wakeup fd") and the signal with it. A Python-level handler runs whatever became of that byte, at
    the main thread's next bytecode; the wakeup descriptor is a socket of its own, written only by
    signals, so it wakes a loop asleep in its selector. Installed and removed from the main thread,
    on the running loop.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, handle: Callable[[signal.Signals], None]
    ) -> None:
        self._loop = loop
        self._handle = handle
        self._reader, self._writer = socket.socketpair()
        self._previous: dict[signal.Signals, Any] = {}
        self._previous_fd = -1

    def install(self) -> None:
        for end in (self._reader, self._writer):
            end.setblocking(False)
        self._loop.add_reader(self._reader.fileno(), self._drain)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._previous = {sig: signal.signal(sig, self._caught) for sig in SIGNALS}

    def uninstall(self) -> None:
        """The handlers found at ``install`` back (a test's process lives on); a signal from now on
        is theirs."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        signal.set_wakeup_fd(self._previous_fd)
        self._loop.remove_reader(self._reader.fileno())
        self._reader.close()
        self._writer.close()

    def _caught(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is ending anyway
            self._loop.call_soon_threadsafe(self._handle, signal.Signals(signum))

    def _drain(self) -> None:
        """The wakeup bytes have done their work (the loop is awake); the handler has the signal
        itself."""
        with contextlib.suppress(OSError):
            while self._reader.recv(4096):
                pass


class Daemon:
    """One running ``ocrwatch run``: owns the ledger, the pipeline, the health endpoint and the
    signals."""

    def __init__(self, cfg: Config, config_path: Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.metrics = Metrics()
        self.lag_probe = LoopLagProbe(self.metrics)
        self.ledger: AsyncLedger | None = None
        self.pipeline: Pipeline | None = None
        self.health: HealthServer | None = None
        self.local: LocalSource | None = None
        self.local_sink: LocalSink | None = None
        self.control: ControlServer | None = None
        self._stop = asyncio.Event()
        self.life = Lifecycle(self._stop)  # what the control channel reads of this daemon
        self._reload = asyncio.Event()
        self._force = asyncio.Event()
        self._gpus: dict[str, int] = {}
        self._state_lock: IO[str] | None = None
        self._background: list[asyncio.Task[None]] = []
        self.outbox = Outbox()  # the jobs every source produces, taken by ``intake.serve``
        self._signals: SignalCatcher | None = None

    async def serve(self) -> int:
        """Run until stopped; 0 after a clean stop, 2 when start-up found something only the user
        can fix and 1 for a start-up fault that a later start may not meet again, each said in one
        log line."""
        try:
            try:
                await self.startup()
            except OcrwatchError as exc:
                log.error("startup_failed", kind=exc.kind, error=exc.message, hint=exc.hint)
                return USAGE_EXIT_CODE if isinstance(exc, ConfigError) else 1
            await self.main_loop()
        finally:
            try:
                await self.shutdown()
            finally:
                if self._signals is not None:
                    self._signals.uninstall()
        return 0

    # --- start-up ---------------------------------------------------------------------------------

    async def startup(self) -> None:
        cfg = self.cfg
        self._install_signals()
        self._spawn(self._exit_when_forced(), "forced-exit")
        self._spawn(self.lag_probe.run(), "loop-lag-probe")
        self._prepare_roots()
        cfg = self.cfg  # with its secrets read
        self._prepare_state_dir()
        # what only the user can fix stops the start (exit 2)
        await asyncio.to_thread(checks.preflight, cfg)
        self.ledger = AsyncLedger(Ledger(cfg.state_dir / "ledger.sqlite3"))
        await self._open_control()
        if cfg.metrics.enabled:
            self.health = HealthServer(self.metrics, cfg.metrics.listen, self._update_gauges)
            await self.health.start()
        self.pipeline = Pipeline(cfg, self.ledger, self.metrics)
        await self.pipeline.start()
        self._add_sources(self.pipeline)
        # before the ledger is read: a retry meanwhile starts its jobs itself
        self.life.take_work(self.pipeline)
        # every unfinished job of the ledger, waiting there for a slot: how many
        resumed = await self.pipeline.resume()
        # after resume: it marks done the jobs whose sidecars were written
        await self.pipeline.hooks.start()
        pipeline = self.pipeline
        answers = (pipeline.submit, pipeline.reject, pipeline.lapsed, pipeline.set_aside)
        self._spawn(intake.serve(self.outbox, *answers), "intake")
        for source in self.pipeline.sources.values():
            await source.start(self.outbox)
        if self.health is not None:
            self.health.set_ready(True)
        sd_notify("READY=1")
        self._spawn(self._health_tick(), "health-tick")
        log.info(
            "daemon_ready",
            inboxes=[str(i.path) for i in cfg.inbox],
            s3=len(cfg.s3),
            resumed=resumed,
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        self._background.append(asyncio.create_task(coroutine, name=name))

    def _add_sources(self, pipeline: Pipeline) -> None:
        """The inboxes as one local source writing beside each file; each ``[[s3]]`` as a source of
        its own (SQS or webhook), whose sink shares its S3 client and its threads."""
        cfg = self.cfg
        template = cfg.output.name_template
        written = pipeline.written  # the record of outputs decides what is ocrwatch's own
        self.local = LocalSource(
            cfg.inbox,
            reconcile_seconds=cfg.daemon.reconcile_seconds,
            name_template=template,
            metrics=self.metrics,
        )
        self.local_sink = LocalSink(template, cfg.output.dir, cfg.inbox, written)
        pipeline.add_source(self.local, self.local_sink)
        if not cfg.s3:
            return
        # Imported only when a bucket is configured: boto3 costs start-up time and memory a folder
        # watcher lacks.
        from ocrwatch.sinks.s3 import S3Sink
        from ocrwatch.sources.s3 import S3Source
        from ocrwatch.sources.webhook import WebhookSource

        for index, s3cfg in enumerate(cfg.s3):
            source: S3Source | WebhookSource | AmqpSource
            if s3cfg.transport == "amqp":
                # aio-pika: only where a queue is consumed
                from ocrwatch.sources.amqp import AmqpSource

                source = AmqpSource(
                    s3cfg,
                    name=f"s3:{index}",
                    limits=cfg.limits,
                    name_template=template,
                    max_inflight=pipeline.active_documents,
                    metrics=self.metrics,
                    index=index,
                )
            elif s3cfg.transport == "webhook":
                source = WebhookSource(s3cfg, name=f"s3:{index}", limits=cfg.limits)
            else:
                source = S3Source(
                    s3cfg,
                    name=f"s3:{index}",
                    limits=cfg.limits,
                    max_inflight=pipeline.active_documents,
                )
            sink = S3Sink(s3cfg, source.client, template, cfg.s3)
            pipeline.add_source(source, sink, source.executor)

    def _prepare_roots(self) -> None:
        """Every root made where missing and held to the trust rule (``roots``): each problem said
        at once, in one refusal (exit 2). Secrets that others may read are warned of; those the
        ``*_file`` keys name are read."""
        found = self.cfg.roots()
        roots.prepare(found)
        _warn_exposed(found)
        self.cfg = self.cfg.with_secrets()

    def _prepare_state_dir(self) -> None:
        """Create, lock and probe state_dir, so that a folder the daemon cannot write stops the
        start with its name rather than failing every document later."""
        state = self.cfg.state_dir
        try:
            # as `ocrwatch ocr` makes it: 0700, and any missing parents too
            make_private_dirs(state)
            self._lock_state_dir()
            # what sessions killed with the last process left behind
            _reset_private_dir(state / "tmp")
            for folder in (state, state / "tmp"):
                tempfile.TemporaryFile(dir=folder).close()
        except OSError as exc:
            raise StateUnusable(
                f"state_dir: {exc.filename or state} cannot be written: {exc.strerror or exc}",
                hint=f"make {state} writable by the user ocrwatch runs as (on a writable "
                "filesystem), "
                "or point state_dir at another folder",
            ) from None

    def _lock_state_dir(self) -> None:
        """One daemon per state directory: a second would process every document twice. Released by
        the kernel whenever this process ends, ``kill -9`` included. Tried for a second: a client
        probing whether a daemon runs (``control.daemon_holds``) holds it for an instant."""
        path = self.cfg.state_dir / LOCK_NAME
        lock = open(path, "a", opener=open_private)  # noqa: SIM115 - held for the process's life
        try:
            for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(BlockingIOError),
                stop=tenacity.stop_after_delay(1.0),
                wait=tenacity.wait_fixed(0.05),
                reraise=True,
            ):
                with attempt:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StateUnusable(
                f"state_dir: {self.cfg.state_dir} is in use by another running ocrwatch",
                hint="stop the other daemon, or give this one its own state_dir",
            ) from None
        self._state_lock = lock

    async def _open_control(self) -> None:
        """The control socket, right after the lock: a client that finds the lock held finds the
        socket too."""
        assert self.ledger is not None
        self.control = ControlServer(self.cfg.state_dir, self.cfg, self.ledger, self.life)
        try:
            await self.control.start()
        except OSError as exc:
            raise StateUnusable(
                f"state_dir: the control socket {self.control.path} cannot be created: "
                f"{exc.strerror or exc}",
                hint="put state_dir on a local filesystem that can hold Unix sockets",
            ) from None

    # --- signals: handlers only set events --------------------------------------------------------

    def _install_signals(self) -> None:
        self._signals = SignalCatcher(asyncio.get_running_loop(), self._on_signal)
        self._signals.install()

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGHUP:
            self._reload.set()
            return
        if sig == signal.SIGINT and self._stop.is_set():  # Ctrl-C again while stopping: do not wait
            self._force.set()
        self._stop.set()

    async def _exit_when_forced(self) -> None:
        """Acts on a second interrupt at any moment (start-up, running or draining), without any
        clean-up: whatever was unfinished stays so in the ledger and resumes at the next start."""
        await self._force.wait()
        log.warning("forced_exit")
        os._exit(FORCED_EXIT_CODE)

    # --- running ----------------------------------------------------------------------------------

    async def main_loop(self) -> None:
        while not self._stop.is_set():
            stop = asyncio.create_task(self._stop.wait())
            reload = asyncio.create_task(self._reload.wait())
            await asyncio.wait({stop, reload}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            reload.cancel()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                await self.reload()

    async def reload(self) -> None:
        """SIGHUP: re-read the file; inboxes are added or removed live, other changes need a
        restart."""
        sd_notify("RELOADING=1")
        try:
            new = config_module.load(self.config_path)
            found = new.roots()
            await asyncio.to_thread(roots.prepare, found)  # the rule holds for the new inboxes too
            _warn_exposed(found)
            new = new.with_secrets()
            await asyncio.to_thread(checks.require_languages, new)
            assert self.local is not None
            await self.local.update_inboxes(new.inbox)
            assert self.local_sink is not None
            self.local_sink.update_inboxes(new.inbox)
        except OcrwatchError as exc:
            log.error("reload_failed", kind=exc.kind, error=exc.message, hint=exc.hint)
            sd_notify("READY=1")
            return
        changed = [
            name
            for name in type(new).model_fields
            if name != "inbox" and getattr(new, name) != getattr(self.cfg, name)
        ]
        self.cfg = self.cfg.model_copy(update={"inbox": new.inbox})
        if self.pipeline is not None:
            self.pipeline.reconfigure(self.cfg)
        if changed:
            log.warning("reload_needs_restart", keys=changed)
        log.info("config_reloaded", inboxes=[str(i.path) for i in new.inbox])
        sd_notify("READY=1")

    async def _health_tick(self) -> None:
        """Gauges and the event loop's lag, refreshed; systemd's watchdog fed only while the loop
        keeps up."""
        interval = watchdog_interval(self.cfg.daemon.health_interval_seconds)
        while True:
            start = time.monotonic()
            await asyncio.sleep(interval)
            lag = time.monotonic() - start - interval
            self.metrics.loop_lag.set(max(self.lag_probe.take_worst(), lag, 0.0))
            # NVML: blocking, and per tick is enough
            self._gpus = await asyncio.to_thread(gpu_memory_used)
            self._update_gauges()
            if self.health is not None and self.pipeline is not None:  # /readyz: a tick old at most
                bound = self.cfg.daemon.admission_stall_seconds
                self.health.set_stuck(self.pipeline.admission.stuck(bound))
            if lag < max(interval, 1.0):
                sd_notify("WATCHDOG=1")

    def _update_gauges(self) -> None:
        # None while the engine warms up: /metrics already answers then
        if self.pipeline is not None:
            self.pipeline.update_gauges()
        for gpu, used in self._gpus.items():
            self.metrics.gpu_memory.labels(gpu=gpu).set(used)

    # --- shutdown ---------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop taking work, let running jobs finish for ``shutdown_timeout``, then close
        everything."""
        sd_notify("STOPPING=1")
        if self.health is not None:
            self.health.set_ready(False)
        log.info("daemon_stopping")
        if self.pipeline is not None:
            for source in self.pipeline.sources.values():
                try:
                    await source.stop()
                except Exception as exc:
                    log.warning("source_stop_failed", source=source.name, error=str(exc))
            interrupted = await self.pipeline.drain(self.cfg.daemon.shutdown_timeout)
            if interrupted:
                log.warning("jobs_requeued_at_shutdown", jobs=interrupted)
            await self.pipeline.close()
        if self.control is not None:  # after the drain: ``status`` answers while documents finish
            await self.control.stop()
        for task in self._background:
            task.cancel()
        if self.health is not None:
            await self.health.stop()
        if self.ledger is not None:
            await self.ledger.close()
        log.info("daemon_stopped")


def _warn_exposed(found: tuple[roots.Root, ...]) -> None:
    """A warning for each file holding secrets that others may read (``roots.exposed``)."""
    for problem in roots.exposed(found):
        root = problem.root
        log.warning(
            "secrets_readable",
            key=root.key,
            path=str(root.path),
            error=problem.text,
            hint=problem.fix,
        )


def _reset_private_dir(path: Path) -> None:
    """Empty ``path`` and (re)create it with mode 0700, whatever mode it had."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
