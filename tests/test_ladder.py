"""The page retry ladder: its pure decisions, then whole pages driven through the fault-injecting
engines."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from ocrwatch import ladder
from ocrwatch.config import EngineConfig
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek.options import SamplingRung, VllmConfig
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import EngineDead
from tests.fault_engines import (
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


def rec(raw: str, finish_reason: str | None = "stop") -> Recognition:
    return Recognition(markdown=raw, raw=raw, finish_reason=finish_reason)


@pytest.fixture(autouse=True)
def _fresh_crash_count() -> None:
    reset_crash_count()


# --- pure decisions -------------------------------------------------------------------------------


def test_rungs_start_greedy_then_follow_the_configured_ladder() -> None:
    cfg = EngineConfig()
    rungs = ladder.rungs(cfg)
    assert rungs[0] == Sampling(
        temperature=0.0, ngram_size=30, window_size=90, max_tokens=cfg.vllm.max_tokens
    )
    assert [(r.temperature, r.ngram_size, r.window_size) for r in rungs[1:]] == [
        (0.1, 20, 90),
        (0.2, 12, 120),
    ]
    assert all(r.max_tokens == cfg.vllm.max_tokens for r in rungs)


def test_rungs_are_capped_by_page_attempts_and_follow_vllm_settings() -> None:
    vllm = VllmConfig(
        max_tokens=1000, ngram_size=25, window_size=80, ladder=(SamplingRung(temperature=0.3),) * 5
    )
    rungs = ladder.rungs(EngineConfig(page_attempts=4, vllm=vllm))
    assert len(rungs) == 4
    assert rungs[0] == Sampling(temperature=0.0, ngram_size=25, window_size=80, max_tokens=1000)
    assert {r.temperature for r in rungs[1:]} == {0.3}


def test_tesseract_gets_one_rung_and_accepts_repetition() -> None:
    assert len(ladder.rungs(EngineConfig(kind="tesseract"))) == 1
    assert len(ladder.rungs(EngineConfig(), "tesseract")) == 1
    assert len(ladder.rungs(EngineConfig(kind="tesseract"), "vllm")) == 3
    looping = rec("intro " + LOOP_UNIT * 40)
    assert ladder.judge_for("tesseract")(looping) is None
    assert ladder.judge_for("vllm")(looping) == "loop"
    benchmark = EngineConfig(vllm=VllmConfig(ignore_eos=True))
    assert ladder.judge_for("vllm", benchmark)(looping) is None
    assert ladder.judge_for("vllm", EngineConfig())(looping) == "loop"


def test_needs_retry_names_the_reason() -> None:
    assert ladder.needs_retry(rec("# Title\n\nA normal page of text.")) is None
    assert ladder.needs_retry(rec("# Title\n\n" + LOOP_UNIT * 40)) == "loop"
    assert ladder.needs_retry(rec("# Title\n\n" + LOOP_UNIT * 40, "length")) == "loop"
    assert ladder.needs_retry(rec("A page cut off in the midd", "length")) == "length"
    table = (
        "<table>"
        + "".join(f"<tr><td>row {i}</td><td>{i * 7}</td></tr>" for i in range(60))
        + "</table>"
    )
    assert ladder.needs_retry(rec(table)) is None


# --- whole pages through fault engines ------------------------------------------------------------


def test_a_good_page_takes_one_attempt() -> None:
    engine = EchoEngine()
    result = asyncio.run(
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
    )
    assert result.status == "ok" and result.error is None
    assert result.recognition is not None and result.recognition.raw.startswith(
        "Echo of a 40x60 page"
    )
    assert [a["request_id"] for a in result.attempts] == ["doc/p0/a0"]
    assert result.attempts[0]["outcome"] == "ok" and result.attempts[0]["seconds"] >= 0
    assert engine.requests.seen == ["doc/p0/a0"]


def test_a_greedy_loop_recovers_on_the_next_rung() -> None:
    engine = LoopingEngine(mode="greedy")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
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
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
    )
    assert result.status == "failed"
    assert [a["outcome"] for a in result.attempts] == ["loop", "loop", "loop"]
    assert result.error is not None and result.error["kind"] == "page_failed"
    assert result.recognition is not None and LOOP_UNIT.strip() in result.recognition.raw


def test_a_length_stop_is_retried() -> None:
    engine = LoopingEngine(mode="greedy", finish_reason="length", repeats=1)
    result = asyncio.run(
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
    )
    assert [a["outcome"] for a in result.attempts] == ["length", "ok"]
    assert result.attempts[0]["finish_reason"] == "length"


def test_only_matching_pages_loop() -> None:
    engine = LoopingEngine(mode="always", match=r"/p1/")
    rungs = ladder.rungs(EngineConfig())
    good = asyncio.run(ladder.recognize_page(engine, page("doc/p0"), rungs, TIMEOUT))
    bad = asyncio.run(ladder.recognize_page(engine, page("doc/p1"), rungs, TIMEOUT))
    assert (good.status, bad.status) == ("ok", "failed")


def test_a_hung_attempt_times_out_is_aborted_and_the_next_rung_answers() -> None:
    engine = HangingEngine(match=r"/a0$")
    result = asyncio.run(ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), 0.5))
    assert result.status == "ok"
    assert [a["outcome"] for a in result.attempts] == ["page_timeout", "ok"]
    assert result.attempts[0]["error"]["kind"] == "page_timeout"
    assert result.attempts[0]["seconds"] >= 0.45
    assert engine.hung == ["doc/p0/a0"]
    assert engine.requests.inflight == 0


def test_a_page_that_always_hangs_fails_after_every_rung_timed_out() -> None:
    engine = HangingEngine()
    result = asyncio.run(ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), 0.05))
    assert result.status == "failed" and result.recognition is None
    assert [a["outcome"] for a in result.attempts] == ["page_timeout"] * 3
    assert engine.requests.inflight == 0


class OwnTimeoutEngine(EchoEngine):
    """Times out on its own (a client's timeout, say) on a page's first attempt, long before the
    page
    timeout."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__()
        self.error = error

    async def _work(self, page: PageRequest) -> Recognition:
        if page.request_id.endswith("/a0"):
            raise self.error("the engine's own client timed out")
        return await super()._work(page)


@pytest.mark.parametrize(
    "error", [TimeoutError, asyncio.TimeoutError]
)  # one class from 3.11 on, two before
def test_the_engines_own_timeout_is_a_failed_attempt_not_the_page_timeout(
    error: type[Exception],
) -> None:
    engine = OwnTimeoutEngine(error)
    result = asyncio.run(
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
    )
    assert [a["outcome"] for a in result.attempts] == ["engine_failed", "ok"]
    assert "timed out internally" in result.attempts[0]["error"]["message"]
    assert engine.requests.aborted == []


def test_engine_failed_counts_as_a_failed_attempt() -> None:
    engine = CrashingEngine(every=1, error="failed")
    result = asyncio.run(
        ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
    )
    assert result.status == "failed"
    assert [a["outcome"] for a in result.attempts] == ["engine_failed"] * 3
    assert not engine.dead


def test_engine_dead_propagates_for_the_daemon_to_rebuild() -> None:
    engine = CrashingEngine(every=2)
    rungs = ladder.rungs(EngineConfig())

    async def two_pages() -> None:
        await ladder.recognize_page(engine, page("doc/p0"), rungs, TIMEOUT)
        await ladder.recognize_page(engine, page("doc/p1"), rungs, TIMEOUT)

    with pytest.raises(EngineDead):
        asyncio.run(two_pages())
    assert engine.dead


def test_a_dead_engine_fails_its_in_flight_pages_and_the_count_spans_engines() -> None:
    async def scenario() -> list[BaseException | object]:
        slow = CrashingEngine(every=3, delay=1.0)
        await slow.start()
        rungs = ladder.rungs(EngineConfig())
        pages = [ladder.recognize_page(slow, page(f"doc/p{i}"), rungs, TIMEOUT) for i in range(3)]
        outcomes = await asyncio.gather(*pages, return_exceptions=True)
        rebuilt = CrashingEngine(every=3)
        await rebuilt.start()
        outcomes.append(await ladder.recognize_page(rebuilt, page("doc/p0"), rungs, TIMEOUT))
        return outcomes

    *dead, requeued = asyncio.run(scenario())
    assert all(isinstance(outcome, EngineDead) for outcome in dead)
    assert isinstance(requeued, ladder.PageResult) and requeued.status == "ok"


def test_abort_cancels_a_page_in_any_rung() -> None:
    engine = HangingEngine()

    async def scenario() -> None:
        task = asyncio.create_task(
            ladder.recognize_page(engine, page(), ladder.rungs(EngineConfig()), TIMEOUT)
        )
        while not engine.hung:
            await asyncio.sleep(0.01)
        await engine.abort("doc/p0")
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert engine.requests.aborted == ["doc/p0/a0"]
