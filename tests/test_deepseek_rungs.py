"""DeepSeek-OCR's rungs and judge (``engines.deepseek.rungs``), and which spec brings which: the
page ladder asks the engine's spec for both."""

from __future__ import annotations

from ocrwatch.config import EngineConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import Recognition
from ocrwatch.engines.deepseek import rungs as deepseek
from ocrwatch.engines.deepseek.options import SamplingRung, VllmConfig
from ocrwatch.engines.sampling import Sampling
from tests.support.fault_engines import LOOP_UNIT


def rec(raw: str, finish_reason: str | None = "stop") -> Recognition:
    return Recognition(markdown=raw, raw=raw, finish_reason=finish_reason)


def test_rungs_start_greedy_then_follow_the_configured_ladder() -> None:
    cfg = EngineConfig()
    rungs = deepseek.rungs(cfg)
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
    rungs = deepseek.rungs(EngineConfig(page_attempts=4, vllm=vllm))
    assert len(rungs) == 4
    assert rungs[0] == Sampling(temperature=0.0, ngram_size=25, window_size=80, max_tokens=1000)
    assert {r.temperature for r in rungs[1:]} == {0.3}


def test_each_spec_brings_its_rungs_and_judge() -> None:
    cfg, looping = EngineConfig(), rec("intro " + LOOP_UNIT * 40)
    tesseract, vllm, plugin = (registry.find(kind) for kind in ("tesseract", "vllm", "plugin"))
    assert tesseract.rungs(cfg) == [Sampling()] and tesseract.judge(cfg)(looping) is None
    assert vllm.rungs(cfg) == deepseek.rungs(cfg) and len(vllm.rungs(cfg)) == 3
    assert vllm.judge(cfg)(looping) == "loop"
    benchmark = EngineConfig(vllm=VllmConfig(ignore_eos=True))
    assert vllm.judge(benchmark)(looping) is None
    assert plugin.rungs(cfg) == deepseek.rungs(cfg) and plugin.judge(cfg)(looping) == "loop"


def test_needs_retry_names_the_reason() -> None:
    assert deepseek.needs_retry(rec("# Title\n\nA normal page of text.")) is None
    assert deepseek.needs_retry(rec("# Title\n\n" + LOOP_UNIT * 40)) == "loop"
    assert deepseek.needs_retry(rec("# Title\n\n" + LOOP_UNIT * 40, "length")) == "loop"
    assert deepseek.needs_retry(rec("A page cut off in the midd", "length")) == "length"
    table = (
        "<table>"
        + "".join(f"<tr><td>row {i}</td><td>{i * 7}</td></tr>" for i in range(60))
        + "</table>"
    )
    assert deepseek.needs_retry(rec(table)) is None
