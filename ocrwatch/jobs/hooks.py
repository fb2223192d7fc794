"""Completion hooks: a program run, or a URL posted to, once a document's final status is known.

Each ``[[hook]]`` gets the document's result JSON (the JSON sidecar for ``ok`` and ``partial``, the
error document for ``failed``): a ``command`` on its stdin, never through a shell, with
``OCRWATCH_STATUS``, ``OCRWATCH_SOURCE`` (the source's URI where it is now: ``on_success`` may have
moved it, or deleted it: empty then), ``OCRWATCH_ORIGINAL`` (its URI where it was dropped),
``OCRWATCH_JSON`` and ``OCRWATCH_MD`` in an environment that holds, besides them, only what
``INHERITED`` lets through (never the daemon's secrets); a ``url`` as the body of a POST, with the
same three in its ``Ocrwatch-Status``, ``Ocrwatch-Source`` and ``Ocrwatch-Original`` headers. A zero
exit or a 2xx answer delivers it; anything else is tried again with backoff (tenacity) up to
``max_attempts``. A hook runs after the document is finished, so it never changes the document's
status: it has its own log events, counters and attempts.

Delivery is at least once: the pipeline records each result (``deliveries``) before its sidecars are
written and releases it once the ledger knows the document is finished; every hook's worker takes
released deliveries from an in-memory queue, filled from the ledger at start, so what a stop or a
crash interrupted runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast
from urllib.parse import quote

import aiohttp
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ocrwatch.config import HookConfig
from ocrwatch.errors import OcrwatchError, TransientError, classify
from ocrwatch.infra.metrics import Metrics
from ocrwatch.sinks.base import Sink, dump_json
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, key_id
from ocrwatch.store.asyncledger import AsyncDeliveries, AsyncLedger
from ocrwatch.store.deliveries import Deliveries, HookDelivery

log = structlog.get_logger()

OUTPUT_TAIL = 2048
"""Bytes of a command's output (stdout and stderr together) or of a URL's answer kept for the
log."""
OUTPUT_GRACE = 0.5
"""Seconds a command's output is still read after it exits and its group is killed, for a child
that left the group (``setsid``) and holds the pipe open."""
INHERITED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
"""What a command hook takes from the daemon's environment, with the ``LC_*`` locale: how to find
programs, where its user's home and temporary files are, its language, locale and time zone. Nothing
else, since the daemon's environment carries what is the daemon's alone: its configuration and
secrets (``OCRWATCH_S3_0_SECRET_ACCESS_KEY``), cloud credentials (``AWS_*``), systemd's hand-over
(``NOTIFY_SOCKET``, ``CREDENTIALS_DIRECTORY``). ``HOME`` is kept: curl, git and Python read their
settings from it, and the hook runs as the daemon's user, whose home it could look up anyway."""


class HookFailed(TransientError):
    kind = "hook_failed"
    hint = "the hook is tried again with backoff up to its max_attempts; its output is in the log"


class _Located(Protocol):
    """``sinks.s3.S3Sink``, not imported here: it brings botocore in, which a folder watcher does
    without."""

    def location(self, job: Job) -> tuple[str, dict[str, str]]: ...


def sidecar_locations(sink: Sink, job: Job) -> dict[str, str]:
    """Where the job's sidecars are (``md``, ``json``, ``error``): local paths, or s3:// URIs."""
    if isinstance(sink, LocalSink):
        return {kind: str(path) for kind, path in sink.paths(job).items()}
    bucket, keys = cast(_Located, sink).location(job)
    return {kind: f"s3://{bucket}/{key}" for kind, key in keys.items()}


class HookRunner:
    """The configured hooks, their durable deliveries and one worker pool per hook (``concurrency``
    each).

    With no hook or no ledger (``ocrwatch ocr``) it does nothing: ``hold`` answers None."""

    def __init__(
        self, hooks: Sequence[HookConfig], ledger: AsyncLedger | None, metrics: Metrics
    ) -> None:
        self.hooks = {hook.name: hook for hook in hooks} if ledger is not None else {}
        self._ledger = ledger
        self._store = (
            AsyncDeliveries(Deliveries(ledger.blocking))
            if ledger is not None and self.hooks
            else None
        )
        self._token = secrets.token_hex(8)  # marks the events this process holds
        self._metrics = metrics
        self._queues: dict[str, asyncio.Queue[int]] = {name: asyncio.Queue() for name in self.hooks}
        # waiting or running
        self._queued: dict[str, set[int]] = {name: set() for name in self.hooks}
        self._workers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()  # workers inside a delivery
        self._stopping = False
        self._session: aiohttp.ClientSession | None = None
        for name in self.hooks:
            for outcome in ("delivered", "failed"):
                metrics.hook_deliveries.labels(hook=name, outcome=outcome)
            for result in ("ok", "error"):
                metrics.hook_attempts.labels(hook=name, result=result)
            metrics.hook_pending.labels(hook=name).set_function(
                functools.partial(self._pending, name)
            )

    def _pending(self, name: str) -> int:
        """The deliveries of hook ``name`` queued in memory, which its gauge reads at a scrape."""
        return len(self._queued[name])

    async def start(self) -> None:
        """Settle what earlier processes left held, queue every pending delivery and start the
        workers. Call it after the ledger's unfinished jobs were resumed: a job killed after its
        sidecars were written is marked done then, which is what tells its held result was
        published."""
        if self._store is None:
            return
        self._session = aiohttp.ClientSession()
        recovered = await self._settle_held()
        orphans: dict[str, int] = {}
        for name, event in await self._store.pending():
            if name in self.hooks:
                self._enqueue(name, event)
            else:
                orphans[name] = orphans.get(name, 0) + 1
        if orphans:  # kept, so that configuring the hook again delivers them
            log.warning(
                "hook_deliveries_orphaned",
                hooks=orphans,
                hint="no [[hook]] has these names any more",
            )
        for hook in self.hooks.values():
            for index in range(hook.concurrency):
                self._workers.append(
                    asyncio.create_task(self._work(hook), name=f"hook:{hook.name}:{index}")
                )
        log.info(
            "hooks_ready",
            hooks=list(self.hooks),
            pending=sum(map(len, self._queued.values())),
            recovered=recovered,
        )

    async def stop(self, grace: float = 0.0) -> None:
        """Start no delivery more, let those running finish for ``grace`` seconds, then interrupt
        the rest (each command's process group killed, its attempt given back) and close the HTTP
        session (the ledger is its owner's to close). A stop then never cuts short a hook that was
        about to end; what was pending stays so in the ledger and runs at the next start."""
        self._stopping = True
        for task in self._workers:
            if task not in self._busy:
                task.cancel()
        if busy := [task for task in self._workers if task in self._busy]:
            await asyncio.wait(busy, timeout=grace)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def hold(self, job: Job, document: dict[str, Any], sink: Sink) -> int | None:
        """Record ``document`` (a result or an error document) before it is published, with a
        delivery for each hook that wants its status; the event's id, or None when no hook does."""
        status = str(document["status"])
        wanted = [hook.name for hook in self.hooks.values() if status in hook.on]
        if self._store is None or not wanted:
            return None
        where = sidecar_locations(sink, job)
        json, md = (where["error"], "") if status == "failed" else (where["json"], where["md"])
        payload = await asyncio.to_thread(dump_json, document)  # the very bytes of the sidecar
        return await self._store.hold(
            self._token,
            job.key,
            status,
            job.origin.uri,
            json,
            md,
            payload,
            wanted,
        )

    async def release(self, event: int | None, moved: Mapping[str, str] | None = None) -> None:
        """The event's result is published and its document finished: its deliveries may run.
        ``moved``: where ``archive.apply_on_success`` took the ``json`` and ``md`` sidecars, if it
        did, so a hook never gets a path that no longer exists. Never raises: an event left held is
        released by the next start."""
        if event is None or self._store is None:
            return
        try:
            hooks = await self._store.release(event, moved)
        except Exception as exc:
            error = classify(exc)
            log.error(
                "hook_release_failed",
                kind=error.kind,
                error=error.message,
                hint="released at the next start",
            )
            return
        for hook in hooks:
            if hook in self.hooks:
                self._enqueue(hook, event)

    async def relocate(self, key: str, moved: Mapping[str, str] | None) -> None:
        """The document ``key``'s sidecars were moved (``archive.apply_on_success``, at a start that
        found it done): its recorded results name where they are now. Never raises: a hook is then
        told the old place."""
        if moved is None or self._store is None:
            return
        try:
            await self._store.relocate(key, moved)
        except Exception as exc:
            error = classify(exc)
            log.error(
                "hook_relocate_failed", kind=error.kind, error=error.message, moved=dict(moved)
            )

    # --- the workers ------------------------------------------------------------------------------

    async def _settle_held(self) -> int:
        """Events held by a process that ended before releasing them: released when the ledger
        says the document reached the event's final state, dropped otherwise (it runs again)."""
        assert self._store is not None and self._ledger is not None
        released = 0
        for event, key, status in await self._store.held_elsewhere(self._token):
            row = await self._ledger.known(key)
            if row is not None and row.state == ("failed" if status == "failed" else "done"):
                await self._store.release(event)
                released += 1
            else:
                await self._store.drop(event)
        return released

    def _enqueue(self, hook: str, event: int) -> None:
        if event not in self._queued[hook]:
            self._queued[hook].add(event)
            self._queues[hook].put_nowait(event)

    async def _work(self, hook: HookConfig) -> None:
        queue = self._queues[hook.name]
        worker = asyncio.current_task()
        assert worker is not None
        while not self._stopping:
            event = await queue.get()
            self._busy.add(worker)
            try:
                await self._deliver(hook, event)
            except asyncio.CancelledError:
                raise
            # the ledger, not the hook: the delivery stays pending, tried later
            except Exception as exc:
                error = classify(exc)
                log.error(
                    "hook_delivery_stalled", hook=hook.name, kind=error.kind, error=error.message
                )
                await asyncio.sleep(max(hook.backoff_initial_seconds, 1.0))
                queue.put_nowait(event)
                continue
            finally:
                self._busy.discard(worker)
            self._queued[hook.name].discard(event)

    async def _deliver(self, hook: HookConfig, event: int) -> None:
        """One delivery's attempts, each counted in the ledger before it runs."""
        assert self._store is not None
        delivery = await self._store.load(event, hook.name)
        if delivery is None or delivery.state != "pending":
            return
        fields = {
            "hook": hook.name,
            "job_id": key_id(delivery.key),
            "uri": delivery.original,
            "status": delivery.status,
        }
        left = hook.max_attempts - delivery.attempts
        if left <= 0:  # spent by runs of the daemon that ended while the hook ran
            await self._give_up(
                hook,
                delivery,
                delivery.attempts,
                HookFailed(
                    f"hook {hook.name}: {delivery.attempts} attempts used up in runs of the "
                    "daemon that ended uncleanly"
                ),
            )
            return
        started = time.monotonic()
        attempts = delivery.attempts
        try:
            async for attempt in self._retrying(hook, left, fields):
                with attempt:
                    attempts = await self._store.start_attempt(event, hook.name)
                    try:
                        await self._attempt(hook, delivery)
                    except asyncio.CancelledError:
                        await self._store.give_back(event, hook.name)
                        raise
                    except HookFailed:
                        self._metrics.hook_attempts.labels(hook=hook.name, result="error").inc()
                        raise
        except HookFailed as exc:
            await self._give_up(hook, delivery, attempts, exc)
            return
        self._metrics.hook_attempts.labels(hook=hook.name, result="ok").inc()
        await self._store.finish(event, hook.name, "done", None)
        self._metrics.hook_deliveries.labels(hook=hook.name, outcome="delivered").inc()
        log.info(
            "hook_delivered",
            **fields,
            attempts=attempts,
            seconds=round(time.monotonic() - started, 3),
        )

    def _retrying(
        self, hook: HookConfig, attempts: int, fields: Mapping[str, str]
    ) -> AsyncRetrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "hook_retry",
                **fields,
                attempt=state.attempt_number,
                error=str(exc),
                wait=round(state.upcoming_sleep, 2),
            )

        return AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(
                multiplier=hook.backoff_initial_seconds, max=hook.backoff_max_seconds
            ),
            retry=retry_if_exception_type(HookFailed),
            before_sleep=before_sleep,
            reraise=True,
        )

    async def _give_up(
        self, hook: HookConfig, delivery: HookDelivery, attempts: int, exc: OcrwatchError
    ) -> None:
        assert self._store is not None
        await self._store.finish(delivery.event, hook.name, "failed", exc.message)
        self._metrics.hook_deliveries.labels(hook=hook.name, outcome="failed").inc()
        log.error(
            "hook_failed",
            hook=hook.name,
            job_id=key_id(delivery.key),
            uri=delivery.original,
            status=delivery.status,
            attempts=attempts,
            kind=exc.kind,
            error=exc.message,
            hint=exc.hint,
        )

    async def _attempt(self, hook: HookConfig, delivery: HookDelivery) -> None:
        if hook.command is not None:
            env = {
                key: value
                for key, value in os.environ.items()
                if key in INHERITED or key.startswith("LC_")
            }
            env.update(
                OCRWATCH_STATUS=delivery.status,
                OCRWATCH_SOURCE=delivery.source,
                OCRWATCH_ORIGINAL=delivery.original,
                OCRWATCH_JSON=delivery.json,
                OCRWATCH_MD=delivery.md,
            )
            await run_command(hook.name, hook.command, delivery.payload, env, hook.timeout_seconds)
        else:
            assert hook.url is not None and self._session is not None
            about = {
                "Ocrwatch-Status": delivery.status,
                "Ocrwatch-Source": _header(delivery.source),
                "Ocrwatch-Original": _header(delivery.original),
            }
            await post(
                self._session,
                hook.name,
                hook.url,
                hook.token,
                delivery.payload,
                hook.timeout_seconds,
                about,
            )


async def run_command(
    name: str, argv: Sequence[str], payload: bytes, env: Mapping[str, str], timeout: float
) -> None:
    """Run ``argv`` (no shell) with ``payload`` on stdin, in a process group of its own, killed
    whole when it exits, when ``timeout`` passes or when the caller is cancelled (a stop);
    HookFailed unless it exits 0.

    stdin is an in-memory file rather than a pipe, so a hook that never reads it cannot block the
    daemon, and one that does may seek it. Output goes to a pipe of ours, not asyncio's: asyncio's
    ``wait`` would wait for every pipe to close, which a background child of the hook may never
    do."""
    stdin = os.memfd_create("ocrwatch-hook", os.MFD_CLOEXEC)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    # closed here and by the transport: a second close is a no-op
    reading = os.fdopen(read_end, "rb", buffering=0)
    try:
        await asyncio.to_thread(_fill, stdin, payload)
        output = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(output), reading
        )
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=stdin,
                    stdout=write_end,
                    stderr=write_end,
                    env=dict(env),
                    start_new_session=True,
                )
            except OSError as exc:
                raise HookFailed(
                    f"hook {name}: cannot start {argv[0]}: {exc.strerror or exc}"
                ) from None
            finally:
                os.close(write_end)
                write_end = -1
            tail = asyncio.create_task(_tail(output))
            try:
                code = await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                raise HookFailed(
                    f"hook {name}: still running after {timeout:g}s: its process group killed"
                ) from None
            finally:
                _kill_group(proc.pid)  # ended or not: what the hook left running goes too
                if proc.returncode is None:
                    await proc.wait()
                await asyncio.wait([tail], timeout=OUTPUT_GRACE)
                tail.cancel()
            if code != 0:
                said = (
                    tail.result()
                    if tail.done() and not tail.cancelled() and tail.exception() is None
                    else b""
                )
                reason = f"exit status {code}" if code > 0 else f"killed by signal {-code}"
                raise HookFailed(f"hook {name}: {reason}: {_printable(said)}")
        finally:
            transport.close()
    finally:
        os.close(stdin)
        reading.close()
        if write_end >= 0:
            os.close(write_end)


async def post(
    session: aiohttp.ClientSession,
    name: str,
    url: str,
    token: str | None,
    payload: bytes,
    timeout: float,
    about: Mapping[str, str] | None = None,
) -> None:
    """POST ``payload`` as JSON to ``url``, with the headers ``about``; HookFailed unless the answer
    is 2xx. Redirects are not followed, so the token goes nowhere but ``url``."""
    headers = {**(about or {}), "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with session.post(
            url,
            data=payload,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            said = await response.content.read(OUTPUT_TAIL)
            if not 200 <= response.status < 300:
                raise HookFailed(
                    f"hook {name}: {url} answered {response.status}: {_printable(said)}"
                )
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise HookFailed(f"hook {name}: {url}: {type(exc).__name__}: {exc}") from None


def _header(uri: str) -> str:
    """``uri`` as a header's value: what is not printable ASCII percent-encoded (an S3 key is not
    encoded in its URI; a file's URI is already)."""
    return quote(uri, safe="".join(chr(code) for code in range(0x21, 0x7F)))


def _kill_group(group: int) -> None:
    """SIGKILL the hook's process group (its id is the hook's pid): a child it started and left
    behind (``sleep 120 &``) would otherwise outlive the delivery, and the daemon. While any member
    lives, the kernel gives the id to no other process; once none does, there is no group left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _fill(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)


async def _tail(stream: asyncio.StreamReader) -> bytes:
    """The last ``OUTPUT_TAIL`` bytes of ``stream``; the rest is read and let go."""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-OUTPUT_TAIL:]
    return kept


def _printable(said: bytes) -> str:
    return " ".join(said.decode("utf-8", "replace").split())[-OUTPUT_TAIL:] or "(no output)"
