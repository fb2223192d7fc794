"""The page retry ladder: a page whose output loops or runs out of tokens is tried again on the next
rung.

This is the content-retry layer, engine-agnostic, and the only place that sets per-attempt sampling:
each rung is a ``Sampling`` (greedy first, then the configured ``[engine.vllm] ladder``: higher
temperature, tighter n-gram block or, with ``guard = "stop"``, a repetition penalty); an engine uses
the one it is given. An attempt that fails on its own (``EngineFailed``, or no answer within the
page timeout, which aborts the request) counts as a failed rung too. ``EngineDead`` is not handled
here: it propagates so the daemon rebuilds the engine and requeues the page. A page that fails every
rung is ``failed``; its document becomes ``partial``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import structlog

from ocrwatch.config import EngineConfig
from ocrwatch.engines.base import Engine, PageRequest, Recognition
from ocrwatch.engines.deepseek import grounding
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import EngineFailed, PageFailed, PageTimeout

log = structlog.get_logger()

Judge = Callable[[Recognition], str | None]


@dataclass
class PageResult:
    """What the ladder made of one page: the last output obtained, every attempt, and the
    verdict."""

    status: Literal["ok", "failed"]
    recognition: Recognition | None
    attempts: list[dict[str, Any]]
    error: dict[str, Any] | None = None


def base_sampling(cfg: VllmConfig) -> Sampling:
    """Rung 0: greedy decoding (``Sampling``'s default) with the configured guard
    (``VllmConfig.first_rung``): DeepSeek-OCR's n-gram block, as vLLM's recipe does, or vLLM's own
    repetition stop."""
    return cfg.first_rung()


def rungs(cfg: EngineConfig, kind: str | None = None) -> list[Sampling]:
    """The rungs for the engine ``kind`` (default: the configured one), at most ``page_attempts`` of
    them.

    Tesseract has no sampling to change, so it gets the base rung only. With ``guard = "stop"`` no
    rung bans n-grams (a logits processor would put every decode step of the engine on the host's
    slow path, not only the retried pages'): the rungs after the first re-read a page that stopped
    repeating itself with their temperature and vLLM's built-in ``repetition_penalty``, every one
    but the last with the repetition stop too; the last runs to its end, so a page whose real text
    repeats (a long table of empty cells) is still read whole, and judged by ``needs_retry`` like
    any other.
    """
    vllm = cfg.vllm
    base = base_sampling(vllm)
    if (kind or cfg.kind) == "tesseract":
        return [base]
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


def accept(rec: Recognition) -> str | None:
    """Every output is final: for engines that cannot loop, where repeated text on a page is
    real."""
    return None


def judge_for(kind: str, cfg: EngineConfig | None = None) -> Judge:
    """Tesseract cannot loop; under ``ignore_eos`` (benchmarks) every page ends at max_tokens by
    design."""
    if kind == "tesseract" or (kind == "vllm" and cfg is not None and cfg.vllm.ignore_eos):
        return accept
    return needs_retry


async def recognize_page(
    engine: Engine,
    request: PageRequest,
    rungs: Sequence[Sampling],
    timeout_s: float,
    *,
    judge: Judge = needs_retry,
) -> PageResult:
    """Run one attempt per rung (request id ``{request_id}/a{n}``) until one is good or the rungs
    run
    out."""
    attempts: list[dict[str, Any]] = []
    last: Recognition | None = None
    for number, sampling in enumerate(rungs):
        page = replace(request, request_id=f"{request.request_id}/a{number}", sampling=sampling)
        attempt: dict[str, Any] = {
            "rung": number,
            "request_id": page.request_id,
            "sampling": asdict(sampling),
        }
        attempts.append(attempt)
        started = time.monotonic()
        try:
            rec = await _attempt(engine, page, timeout_s)
        except (EngineFailed, PageTimeout) as exc:
            attempt.update(
                outcome=exc.kind, seconds=round(time.monotonic() - started, 4), error=exc.as_dict()
            )
            log.warning(
                "page_attempt_failed",
                request_id=page.request_id,
                rung=number,
                kind=exc.kind,
                error=exc.message,
            )
            continue
        reason = await asyncio.to_thread(judge, rec)
        attempt.update(
            outcome=reason or "ok",
            seconds=round(time.monotonic() - started, 4),
            prompt_tokens=rec.prompt_tokens,
            completion_tokens=rec.completion_tokens,
            finish_reason=rec.finish_reason,
        )
        last = rec
        if reason is None:
            return PageResult("ok", rec, attempts)
        if number + 1 < len(rungs):
            log.warning(
                "page_retry",
                request_id=page.request_id,
                rung=number,
                reason=reason,
                next=asdict(rungs[number + 1]),
            )
    outcomes = ", ".join(str(attempt.get("outcome")) for attempt in attempts) or "no rungs"
    error = PageFailed(f"{request.request_id}: every rung of the retry ladder failed ({outcomes})")
    log.warning(
        "page_failed", request_id=request.request_id, attempts=len(attempts), outcomes=outcomes
    )
    return PageResult("failed", last, attempts, error.as_dict())


async def _attempt(engine: Engine, page: PageRequest, timeout_s: float) -> Recognition:
    """One attempt under the page timeout; on expiry the engine request is aborted, then
    ``PageTimeout``."""
    try:
        return await asyncio.wait_for(_recognize(engine, page), timeout_s)
    except asyncio.TimeoutError:
        await engine.abort(page.request_id)
        raise PageTimeout(f"{page.request_id}: no answer within {timeout_s:g} s") from None


async def _recognize(engine: Engine, page: PageRequest) -> Recognition:
    """The engine's own timeout, told apart from the page timeout before ``wait_for`` sees it (the
    two
    ``TimeoutError``s are one class from Python 3.11 on, two before)."""
    try:
        return await engine.recognize(page)
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise EngineFailed(f"{page.request_id}: engine timed out internally: {exc}") from exc
