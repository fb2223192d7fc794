"""Several engines behind one: the one replica router, whether its members run in this process or
each in a child process of its own (``engines.process``).

``[engine.vllm] replicas`` are independent engines, each on its own GPUs: unlike vLLM's data
parallelism, whose ranks step in lockstep for a mixture-of-experts decoder such as DeepSeek-OCR's,
replicas never wait for each other, so each page goes to the one with the fewest pages in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ocrwatch import errors
from ocrwatch.engines.base import Engine, PageRequest, Recognition
from ocrwatch.errors import EngineDead

log = structlog.get_logger()


class EngineSet:
    """Several engines behind one: each page goes to the one with the fewest pages in flight.

    A member that dies is restarted on its own while the others go on, and its pages go to them: one
    replica's death must not stop every GPU for a rebuild (a vLLM start is 1-2 minutes). Only when
    every member is down does the page fail as ``EngineDead``, and the daemon's supervisor rebuilds
    the whole set.

    ``describe()`` is the first member's, with the number of members under ``count_as``:
    ``"processes"`` for members in child processes (each of which describes itself as one replica),
    ``"replicas"`` for members in this process."""

    def __init__(self, engines: list[Engine], *, count_as: str = "processes") -> None:
        self.engines = engines
        self.count_as = count_as
        self._load = [0] * len(engines)
        self._down: set[int] = set()
        self._restarts: dict[int, asyncio.Task[None]] = {}
        self._closing = False
        self._adopt()

    def _adopt(self) -> None:
        """Name, geometry and capacity from the engines; a ``ProcessEngine`` learns its own only at
        start."""
        self.name = self.engines[0].name
        self.geometry = self.engines[0].geometry
        self.max_concurrency = sum(engine.max_concurrency for engine in self.engines)

    async def start(self) -> None:
        try:
            # one after the other: a vLLM engine finds the first one's compile cache
            for engine in self.engines:
                await engine.start()
        except BaseException:
            await self.close()
            raise
        self._adopt()

    async def recognize(self, page: PageRequest) -> Recognition:
        result: Recognition | None = None
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(EngineDead),
            stop=stop_after_attempt(len(self.engines)),
            reraise=True,
        ):
            with attempt:
                result = await self._recognize_on_one(page)
        assert result is not None
        return result

    async def _recognize_on_one(self, page: PageRequest) -> Recognition:
        up = [index for index in range(len(self.engines)) if index not in self._down]
        if not up:
            raise EngineDead(f"{self.name}: all {len(self.engines)} replicas are down")
        index = min(up, key=self._load.__getitem__)
        self._load[index] += 1
        try:
            return await self.engines[index].recognize(page)
        except EngineDead as exc:
            self._member_died(index, exc)
            raise
        finally:
            self._load[index] -= 1

    def _member_died(self, index: int, exc: EngineDead) -> None:
        if index in self._down or self._closing:
            return
        self._down.add(index)
        log.error(
            "engine_replica_dead",
            engine=self.name,
            replica=index,
            error=exc.message,
            replicas_up=len(self.engines) - len(self._down),
        )
        self._restarts[index] = asyncio.create_task(
            self._restart(index), name=f"restart-replica-{index}"
        )

    async def _restart(self, index: int) -> None:
        """Close what is left of the member, then start it again with backoff until it runs or
        cannot."""
        engine = self.engines[index]
        try:
            # bounded: a ProcessEngine kills a child that does not stop in CLOSE_SECONDS
            await engine.close()
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda exc: errors.classify(exc).retryable),
                wait=wait_exponential_jitter(multiplier=1, max=60),
                reraise=True,
            ):
                with attempt:
                    await engine.start()
        except Exception as exc:  # a member that cannot start stays down; the others go on
            error = errors.classify(exc)
            log.error(
                "engine_replica_failed",
                engine=self.name,
                replica=index,
                kind=error.kind,
                error=error.message,
            )
            return
        self._down.discard(index)
        up = len(self.engines) - len(self._down)
        log.info("engine_replica_restarted", engine=self.name, replica=index, replicas_up=up)

    async def abort(self, request_id: str) -> None:
        for engine in self.engines:
            await engine.abort(request_id)

    def release(self) -> None:
        for engine in self.engines:
            engine.release()

    async def close(self) -> None:
        self._closing = True
        restarts = list(self._restarts.values())
        for task in restarts:
            task.cancel()
        await asyncio.gather(*restarts, return_exceptions=True)
        for engine in self.engines:
            await engine.close()

    def describe(self) -> dict[str, Any]:
        return self.engines[0].describe() | {self.count_as: len(self.engines)}
