"""DeepSeek-OCR's retry rungs and output judge, which its ``EngineSpec`` hands the page ladder.

The rungs are built from ``[engine.vllm]`` (its ``ladder`` and ``guard``); the judge knows how a
decoding loop looks in DeepSeek's output (``grounding.find_loop``) and what vLLM's finish reasons
mean.
"""

from __future__ import annotations

from dataclasses import replace

from ocrwatch.config import EngineConfig
from ocrwatch.engines.base import Judge, Recognition, accept
from ocrwatch.engines.deepseek import grounding
from ocrwatch.engines.sampling import Sampling


def rungs(cfg: EngineConfig) -> list[Sampling]:
    """Greedy with the configured guard (``VllmConfig.first_rung``), then the ``ladder``'s rungs,
    at most ``page_attempts`` in all.

    With ``guard = "stop"`` no rung bans n-grams (a logits processor would put every decode step of
    the engine on the host's slow path, not only the retried pages'): the rungs after the first
    re-read a page that stopped repeating itself with their temperature and vLLM's built-in
    ``repetition_penalty``, every one but the last with the repetition stop too; the last runs to
    its end, so a page whose real text repeats (a long table of empty cells) is still read whole,
    and judged like any other.
    """
    vllm = cfg.vllm
    base = vllm.first_rung()
    stop = vllm.guard == "stop"
    ladder = [
        Sampling(
            temperature=rung.temperature,
            ngram_size=0 if stop else rung.ngram_size,
            window_size=0 if stop else rung.window_size,
            max_tokens=vllm.max_tokens,
            repetition_penalty=rung.repetition_penalty,
            stop_pattern=base.stop_pattern,
            stop_count=base.stop_count,
        )
        for rung in vllm.ladder
    ]
    chosen = [base, *ladder][: cfg.page_attempts]
    if stop and len(chosen) > 1:
        chosen[-1] = replace(chosen[-1], stop_pattern=0, stop_count=0)
    return chosen


def needs_retry(rec: Recognition) -> str | None:
    """Why this output should be tried again (``"loop"``, ``"length"``), or None when it is good.
    vLLM's repetition stop (finish reason ``repetition``) is a loop whatever the text cut short
    before it shows."""
    if rec.finish_reason == "repetition" or grounding.find_loop(rec.raw) is not None:
        return "loop"
    if rec.finish_reason == "length":
        return "length"
    return None


def judge(cfg: EngineConfig) -> Judge:
    """``needs_retry``; under ``ignore_eos`` (benchmarks) every page ends at max_tokens by design,
    so every output is final."""
    return accept if cfg.vllm.ignore_eos else needs_retry
