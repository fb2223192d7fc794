"""The page retry ladder: whole pages driven through the fault-injecting engines, on DeepSeek's
rungs and judge (the ladder's own decisions are the engine's: ``test_deepseek_rungs``)."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from ocrwatch.config import EngineConfig
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek import rungs as deepseek
from ocrwatch.errors import EngineDead
from ocrwatch.recognize import ladder
from tests.support.fault_engines import (
    LOOP_UNIT,
    CrashingEngine,
    EchoEngine,
    HangingEngine,
    LoopingEngine,
    reset_crash_count,
)

TIMEOUT = 5.0


def page(request_id: str = "doc/p0") -> PageRequest:
    return PageRequest(
        request_id=request_id, image=Image.new("L", (40, 60), 255), prompt="<image>\nFree OCR."
    )


JUDGE = deepseek.needs_retry


@pytest.fixture(autouse=True)
def _fresh_crash_count() -> None:
    reset_crash_count()


# --- whole pages through fault engines ------------------------------------------------------------


def test_a_good_page_takes_one_attempt() -> None:
    engine = EchoEngine()
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert result.status == "ok" and result.error is None
    assert result.recognition is not None and result.recognition.raw.startswith(
        "Echo of a 40x60 page"
    )
    assert [a["request_id"] for a in result.attempts] == ["doc/p0/a0"]
    assert result.attempts[0]["outcome"] == "ok" and result.attempts[0]["seconds"] >= 0
    assert engine.requests.seen == ["doc/p0/a0"]


def test_each_try_records_its_sampling_only_where_the_engine_samples() -> None:
    """DeepSeek's tries say how each rung sampled; an engine that samples nothing (Tesseract,
    ``EngineSpec.prompted`` False) gets no sampling recorded it never used."""
    rungs = deepseek.rungs(EngineConfig())
    sampled = asyncio.run(ladder.recognize_page(EchoEngine(), page(), rungs, TIMEOUT, JUDGE))
    plain = asyncio.run(
        ladder.recognize_page(EchoEngine(), page(), rungs, TIMEOUT, JUDGE, sampled=False)
    )
    assert sampled.attempts[0]["sampling"]["temperature"] == 0.0
    assert plain.status == "ok" and "sampling" not in plain.attempts[0]


def test_a_greedy_loop_recovers_on_the_next_rung() -> None:
    engine = LoopingEngine(mode="greedy")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert result.status == "ok"
    assert [a["outcome"] for a in result.attempts] == ["loop", "ok"]
    assert [a["request_id"] for a in result.attempts] == ["doc/p0/a0", "doc/p0/a1"]
    assert engine.temperatures == [0.0, 0.1]
    assert result.attempts[1]["sampling"] == {
        "temperature": 0.1,
        "ngram_size": 20,
        "window_size": 90,
        "max_tokens": 4096,
        "repetition_penalty": 1.05,
        "stop_pattern": 0,
        "stop_count": 0,
    }
    assert result.recognition is not None and "Echo" in result.recognition.raw


def test_a_page_looping_on_every_rung_fails_with_its_attempts() -> None:
    engine = LoopingEngine(mode="always")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert result.status == "failed"
    assert [a["outcome"] for a in result.attempts] == ["loop", "loop", "loop"]
    assert result.error is not None and result.error["kind"] == "page_failed"
    assert result.recognition is not None and LOOP_UNIT.strip() in result.recognition.raw


def test_a_length_stop_is_retried() -> None:
    engine = LoopingEngine(mode="greedy", finish_reason="length", repeats=1)
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert [a["outcome"] for a in result.attempts] == ["length", "ok"]
    assert result.attempts[0]["finish_reason"] == "length"


def test_only_matching_pages_loop() -> None:
    engine = LoopingEngine(mode="always", match=r"/p1/")
    rungs = deepseek.rungs(EngineConfig())
    good = asyncio.run(ladder.recognize_page(engine, page("doc/p0"), rungs, TIMEOUT, JUDGE))
    bad = asyncio.run(ladder.recognize_page(engine, page("doc/p1"), rungs, TIMEOUT, JUDGE))
    assert (good.status, bad.status) == ("ok", "failed")


def test_a_hung_attempt_times_out_is_aborted_and_the_next_rung_answers() -> None:
    engine = HangingEngine(match=r"/a0$")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), 0.5, JUDGE)
    )
    assert result.status == "ok"
    assert [a["outcome"] for a in result.attempts] == ["page_timeout", "ok"]
    assert result.attempts[0]["error"]["kind"] == "page_timeout"
    assert result.attempts[0]["seconds"] >= 0.45
    assert engine.hung == ["doc/p0/a0"]
    assert engine.requests.inflight == 0


def test_a_page_that_always_hangs_fails_after_every_rung_timed_out() -> None:
    engine = HangingEngine()
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), 0.05, JUDGE)
    )
    assert result.status == "failed" and result.recognition is None
    assert [a["outcome"] for a in result.attempts] == ["page_timeout"] * 3
    assert engine.requests.inflight == 0


class OwnTimeoutEngine(EchoEngine):
    """Times out on its own (a client's timeout, say) on a page's first attempt, long before the
    page timeout."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__()
        self.error = error

    async def _work(self, page: PageRequest) -> Recognition:
        if page.request_id.endswith("/a0"):
            raise self.error("the engine's own client timed out")
        return await super()._work(page)


# one class from 3.11 on, two before
@pytest.mark.parametrize("error", [TimeoutError, asyncio.TimeoutError])
def test_the_engines_own_timeout_is_a_failed_attempt_not_the_page_timeout(
    error: type[Exception],
) -> None:
    engine = OwnTimeoutEngine(error)
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert [a["outcome"] for a in result.attempts] == ["engine_failed", "ok"]
    assert "timed out internally" in result.attempts[0]["error"]["message"]
    assert engine.requests.aborted == []


def test_engine_failed_counts_as_a_failed_attempt() -> None:
    engine = CrashingEngine(every=1, error="failed")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
    )
    assert result.status == "failed"
    assert [a["outcome"] for a in result.attempts] == ["engine_failed"] * 3
    assert not engine.dead


def test_engine_dead_propagates_for_the_daemon_to_rebuild() -> None:
    engine = CrashingEngine(every=2)
    rungs = deepseek.rungs(EngineConfig())

    async def two_pages() -> None:
        await ladder.recognize_page(engine, page("doc/p0"), rungs, TIMEOUT, JUDGE)
        await ladder.recognize_page(engine, page("doc/p1"), rungs, TIMEOUT, JUDGE)

    with pytest.raises(EngineDead):
        asyncio.run(two_pages())
    assert engine.dead


def test_a_dead_engine_fails_its_in_flight_pages_and_the_count_spans_engines() -> None:
    async def scenario() -> list[BaseException | object]:
        slow = CrashingEngine(every=3, delay=1.0)
        await slow.start()
        rungs = deepseek.rungs(EngineConfig())
        pages = [
            ladder.recognize_page(slow, page(f"doc/p{i}"), rungs, TIMEOUT, JUDGE) for i in range(3)
        ]
        outcomes = await asyncio.gather(*pages, return_exceptions=True)
        rebuilt = CrashingEngine(every=3)
        await rebuilt.start()
        outcomes.append(await ladder.recognize_page(rebuilt, page("doc/p0"), rungs, TIMEOUT, JUDGE))
        return outcomes

    *dead, requeued = asyncio.run(scenario())
    assert all(isinstance(outcome, EngineDead) for outcome in dead)
    assert isinstance(requeued, ladder.PageResult) and requeued.status == "ok"


def test_abort_cancels_a_page_in_any_rung() -> None:
    engine = HangingEngine()

    async def scenario() -> None:
        task = asyncio.create_task(
            ladder.recognize_page(engine, page(), deepseek.rungs(EngineConfig()), TIMEOUT, JUDGE)
        )
        while not engine.hung:
            await asyncio.sleep(0.01)
        await engine.abort("doc/p0")
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert engine.requests.aborted == ["doc/p0/a0"]
