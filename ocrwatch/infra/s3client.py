"""The one S3 client module: boto3 clients, retries, error mapping, and the probe ``ocrwatch check``
runs.

Sources and sinks share it, so a transient failure means the same thing everywhere. Clients are made
on demand, never at import. One retry layer: botocore tries each request once (``total_max_attempts
= 1``) and ``call`` retries a transient failure with tenacity, ``CALL_ATTEMPTS`` = 5 attempts 0.5,
1, 2 and 4 s apart (plus up to 0.5 s of jitter each): an outage of 7.5 to 9.5 s (besides the
attempts' own time, at most a 5 s connect or 60 s read timeout each) is ridden out within the call.
What survives is ``StorageUnavailable``, a fault of the place that the pipeline retries for as long
as it lasts; it is mapped without ever carrying credentials.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import boto3
import botocore.exceptions
import structlog
from botocore.config import Config as BotoConfig
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

from ocrwatch.config import S3Config
from ocrwatch.errors import OcrwatchError, PermanentError, StorageUnavailable

log = structlog.get_logger()

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
CALL_ATTEMPTS = 5
THREADS = 8
MAX_KEY_BYTES = 1024
"""The longest key S3 holds, in UTF-8 bytes."""
NOT_FOUND = frozenset({"NoSuchKey", "NoSuchVersion", "NoSuchBucket", "404", "NotFound"})
"""S3's codes for "nothing there": a key, a version or a bucket (a HEAD answers a bare 404)."""
_INVALID_NAME = frozenset({"InvalidObjectName", "KeyTooLongError"})
_INVALID_REQUEST = _INVALID_NAME | {"InvalidBucketName", "InvalidArgument", "InvalidURI"}
_THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailableException",
    }
)


def new_client(cfg: S3Config, service: str, *, read_timeout: float = READ_TIMEOUT) -> Any:
    """A boto3 client for ``service`` configured from ``cfg``; credentials from the config or the
    standard chain."""
    session = boto3.session.Session(
        aws_access_key_id=cfg.access_key_id,
        aws_secret_access_key=cfg.secret_access_key,
        region_name=cfg.region,
    )
    config = BotoConfig(
        retries={"mode": "standard", "total_max_attempts": 1},  # tenacity is the one retry layer
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=read_timeout,
        s3={"addressing_style": cfg.addressing_style},
    )
    return session.client(service, endpoint_url=cfg.endpoint_url, config=config)


# ``stopping``: the event of the S3Threads pool the current thread belongs to
_thread = threading.local()


class S3Threads(Executor):
    """A bounded pool of threads of its own for one bucket's blocking calls (``THREADS`` at most,
    started on demand): an unreachable endpoint, each call retried with backoff, ties up these
    threads and never the default pool that the ledger, the inbox and every other source use.

    ``shutdown`` cuts short the retries of the calls still running here, and the threads are daemon
    threads: a call stuck on a bucket that accepts and never answers (60 s read timeout) does not
    hold the process's exit, which ``ThreadPoolExecutor`` would, since the interpreter joins its
    threads at exit.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.stopping = threading.Event()
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self.stopping.is_set():
                raise RuntimeError(f"{self.name}: cannot schedule new calls after shutdown")
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and len(self._threads) < THREADS:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"ocrwatch-{self.name}-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        _thread.stopping = self.stopping
        while (item := self._work.get()) is not None:
            future, work = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # handed to whoever awaits the future
                    future.set_exception(exc)
            del item, future, work
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self.stopping.set()
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def error_code(exc: BaseException) -> str:
    """S3's error code for a ``ClientError``, else the exception's class name: short enough to
    log."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """True for failures of the world (connection refused, timeouts, 5xx, throttling) that a retry
    may cure."""
    if isinstance(
        exc,
        (
            botocore.exceptions.ConnectionError,
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.IncompleteReadError,
            ConnectionError,
            TimeoutError,
            asyncio.TimeoutError,
        ),
    ):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return status >= 500 or status == 429 or error_code(exc) in _THROTTLING
    return False


def is_not_found(exc: BaseException) -> bool:
    """True when S3 says no object is there (``NOT_FOUND``)."""
    return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in NOT_FOUND


def is_invalid_name(exc: BaseException) -> bool:
    """True when S3 refused a key as a name (over 1024 bytes, say): no object can exist under it."""
    return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in _INVALID_NAME


class InvalidRequest(PermanentError):
    """S3 refused the request itself (an invalid bucket name or key): the same request fails every
    time."""

    kind = "s3_request_invalid"
    hint = (
        "the event names a bucket or key S3 refuses; rename the object, or look for what sends "
        "such events"
    )


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning(
        "s3_call_retry",
        attempt=state.attempt_number,
        error=error_code(exc) if exc else None,
        delay=round(state.upcoming_sleep, 2),
    )


def _retry_kwargs(attempts: int) -> dict[str, Any]:
    return {
        "retry": retry_if_exception(is_transient),
        "wait": wait_exponential(multiplier=0.5, max=10.0) + wait_random(0, 0.5),
        "stop": stop_after_attempt(attempts),
        "before_sleep": _log_retry,
        "reraise": True,
    }


def call(fn: Callable[..., T], /, *, attempts: int = CALL_ATTEMPTS, **kwargs: Any) -> T:
    """One blocking boto3 call, retried with backoff while its failure is transient (for worker
    threads; in an ``S3Threads`` pool that is shut down, no further attempt is made)."""
    stopping: threading.Event = getattr(_thread, "stopping", None) or threading.Event()
    retry = _retry_kwargs(attempts) | {
        "stop": stop_after_attempt(attempts) | stop_when_event_set(stopping),
        "sleep": stopping.wait,
    }
    for attempt in Retrying(**retry):
        with attempt:
            if stopping.is_set() and attempt.retry_state.attempt_number > 1:
                raise StorageUnavailable("not tried again: the daemon is stopping")
            return fn(**kwargs)
    raise AssertionError("unreachable: tenacity reraises")


async def acall(
    fn: Callable[..., T],
    /,
    *,
    attempts: int = CALL_ATTEMPTS,
    executor: Executor | None = None,
    **kwargs: Any,
) -> T:
    """``call`` for the event loop: each attempt runs in a thread of ``executor`` (the source's own;
    None: the default pool), the backoff sleeps on the loop."""
    loop = asyncio.get_running_loop()
    async for attempt in AsyncRetrying(**_retry_kwargs(attempts)):
        with attempt:
            return await loop.run_in_executor(executor, functools.partial(fn, **kwargs))
    raise AssertionError("unreachable: tenacity reraises")


def storage_error(exc: BaseException, what: str) -> OcrwatchError:
    """Map a boto3 failure that survived the retries onto the hierarchy (never carrying
    credentials): a request S3 refuses as invalid is permanent, everything else (outage, throttling,
    access) transient."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return StorageUnavailable(
            f"{what}: no credentials",
            hint="set access_key_id/secret_access_key in [[s3]] "
            "or provide credentials through the AWS standard chain",
        )
    if isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in (
        "AccessDenied",
        "403",
        "Forbidden",
    ):
        return StorageUnavailable(
            f"{what}: access denied", hint="grant the credentials access to the bucket"
        )
    if isinstance(exc, botocore.exceptions.ParamValidationError) or (
        isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in _INVALID_REQUEST
    ):
        return InvalidRequest(f"{what}: {error_code(exc)}")
    return StorageUnavailable(f"{what}: {error_code(exc)}: {exc}")
