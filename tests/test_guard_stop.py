"""``guard = "stop"``: vLLM's repetition stop as the first rung, and the ladder re-reading only the
pages that stopped that way.

``RecordedEngine`` replays recorded outputs token by token and ends an attempt the way vLLM 0.26's
scheduler does (``vllm/v1/core/sched/utils.py``: ``check_stop`` after every token,
``check_sequence_repetition``, then finish reason ``repetition``), so the ladder sees what it would
see from vLLM: a looping page cut short after ``stop_count`` repeats, a good page whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from PIL import Image

from ocrwatch.config import EngineConfig
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek import arguments
from ocrwatch.engines.deepseek import rungs as deepseek
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.sampling import Sampling
from ocrwatch.recognize import ladder
from tests.support.engines_base import StubEngine

TIMEOUT = 5.0
STOP = EngineConfig(vllm=VllmConfig(guard="stop"))

# A DeepSeek-OCR page's greedy output that falls into a loop after its first lines (the shape
# reported for real weights: one line, here a table row, comes back until max_tokens), as words; and
# the same page read with a repetition penalty, which leaves the loop.
HEAD = [
    "<|ref|>title<|/ref|><|det|>[[92,",
    "61,",
    "905,",
    "98]]<|/det|>\n#",
    "Quarterly",
    "results",
    "2026\n\n<|ref|>table<|/ref|><|det|>[[90,",
    "120,",
    "910,",
    "640]]<|/det|>\n<table><tr><td>Region</td><td>Q1</td><td>Q2</td></tr>",
]
LOOP = ["<tr><td>North</td><td>1", "204</td><td>1", "311</td></tr>"]
CLEAN = [
    *HEAD,
    *[
        "<tr><td>North</td><td>1",
        "204</td><td>1",
        "311</td></tr><tr><td>South</td><td>877</td><td>902</td></tr></table>\n\nFigures",
        "in",
        "thousands",
        "of",
        "euros.",
    ],
]
# A page whose real text repeats: a table row of empty cells, long enough to trip the stop.
EMPTY_ROW = [
    *["<table><tr><td>Name</td><td>Notes</td></tr>"],
    *["<td></td>"] * 40,
    "</table>",
]


def vllm_stops(tokens: Sequence[str], max_pattern: int, min_count: int) -> bool:
    """vLLM 0.26's ``check_sequence_repetition`` (min_pattern_size 0, so 1): the tail is some
    pattern of 1..max_pattern tokens repeated min_count times."""
    for size in range(1, max_pattern + 1):
        if size * min_count > len(tokens):
            return False
        if all(
            tokens[-n] == tokens[-(size * m + n)]
            for n in range(1, size + 1)
            for m in range(1, min_count)
        ):
            return True
    return False


class RecordedEngine(StubEngine):
    """Replays ``outputs[page id]``: the greedy recording at temperature 0 without a penalty, the
    penalised one otherwise (``penalised``, default the greedy one), a looping recording repeated up
    to ``max_tokens``."""

    name = "recorded"

    def __init__(
        self, greedy: dict[str, list[str]], penalised: dict[str, list[str]] | None = None
    ) -> None:
        super().__init__(max_concurrency=4, dpi=100)
        self.greedy, self.penalised = greedy, penalised or {}
        self.attempts: list[tuple[str, Sampling]] = []

    async def _work(self, page: PageRequest) -> Recognition:
        page_id = page.request_id.rsplit("/a", 1)[0]
        self.attempts.append((page.request_id, page.sampling))
        plain = page.sampling.temperature == 0 and page.sampling.repetition_penalty == 1.0
        source = (
            self.greedy[page_id] if plain else self.penalised.get(page_id, self.greedy[page_id])
        )
        out: list[str] = []
        finish = "stop"
        for index in range(page.sampling.max_tokens):
            if index >= len(source) and source[-len(LOOP) :] != LOOP:
                break
            out.append(
                source[index] if index < len(source) else LOOP[(index - len(source)) % len(LOOP)]
            )
            stop = page.sampling.stop_pattern
            if stop and vllm_stops(out, stop, page.sampling.stop_count):
                finish = "repetition"
                break
        else:
            finish = "length"
        raw = " ".join(out)
        return Recognition(markdown=raw, raw=raw, finish_reason=finish, completion_tokens=len(out))


def page(request_id: str) -> PageRequest:
    return PageRequest(
        request_id=request_id, image=Image.new("L", (40, 60), 255), prompt="<image>\nFree OCR."
    )


def read(
    engine: RecordedEngine, ids: list[str], cfg: EngineConfig = STOP
) -> dict[str, ladder.PageResult]:
    async def all_pages() -> list[ladder.PageResult]:
        rungs = deepseek.rungs(cfg)
        return await asyncio.gather(
            *(
                ladder.recognize_page(engine, page(i), rungs, TIMEOUT, deepseek.judge(cfg))
                for i in ids
            )
        )

    return dict(zip(ids, asyncio.run(all_pages()), strict=True))


def test_stop_rungs_ban_nothing_and_only_the_last_reads_to_the_end() -> None:
    rungs = deepseek.rungs(STOP)
    assert rungs[0] == Sampling(ngram_size=0, window_size=0, stop_pattern=32, stop_count=16)
    assert all(r.ngram_size == 0 and r.window_size == 0 for r in rungs)
    assert [(r.temperature, r.repetition_penalty) for r in rungs[1:]] == [(0.1, 1.05), (0.2, 1.1)]
    assert [(r.stop_pattern, r.stop_count) for r in rungs] == [(32, 16), (32, 16), (0, 0)]
    two = deepseek.rungs(EngineConfig(page_attempts=1, vllm=VllmConfig(guard="stop")))
    assert two == [rungs[0]]


def test_stop_registers_no_logits_processor_and_asks_vllm_to_stop() -> None:
    cfg = STOP.vllm
    assert not arguments.uses_ngram_guard(cfg)
    assert "logits_processors" not in arguments.engine_kwargs(cfg)
    first, second, last = deepseek.rungs(STOP)
    stop = arguments.sampling_kwargs(cfg, first)["repetition_detection"]
    assert stop == {"max_pattern_size": 32, "min_count": 16}
    retry = arguments.sampling_kwargs(cfg, second)
    assert retry["repetition_penalty"] == 1.05 and "extra_args" not in retry
    assert "repetition_detection" not in arguments.sampling_kwargs(cfg, last)
    assert "repetition_penalty" not in arguments.sampling_kwargs(cfg, first)
    host = VllmConfig(ngram_processor="batched")
    # "ban" on the host: DeepSeek's processor
    assert arguments.engine_kwargs(host)["logits_processors"]
    assert "logits_processors" not in arguments.engine_kwargs(
        VllmConfig(guard="stop", ngram_processor="batched")
    )


def test_a_looping_page_stops_early_and_is_the_only_one_read_again() -> None:
    engine = RecordedEngine(
        greedy={"doc/p0": CLEAN, "doc/p1": [*HEAD, *LOOP], "doc/p2": CLEAN},
        penalised={"doc/p1": CLEAN},
    )
    results = read(engine, ["doc/p0", "doc/p1", "doc/p2"])
    assert all(result.status == "ok" for result in results.values())
    assert sorted(request for request, _ in engine.attempts) == [
        "doc/p0/a0",
        "doc/p1/a0",
        "doc/p1/a1",
        "doc/p2/a0",
    ]
    first, second = results["doc/p1"].attempts
    assert (first["outcome"], first["finish_reason"]) == ("loop", "repetition")
    # cut after 16 repeats of its shortest repeated tail, not at max_tokens (4096)
    assert first["completion_tokens"] < len(HEAD) + 16 * len(LOOP) + len(LOOP)
    assert second["outcome"] == "ok" and second["sampling"]["repetition_penalty"] == 1.05
    assert second["sampling"]["ngram_size"] == 0
    recognition = results["doc/p1"].recognition
    assert recognition is not None and recognition.raw.endswith("Figures in thousands of euros.")


def test_real_repeated_text_is_read_whole_by_the_last_rung() -> None:
    engine = RecordedEngine(greedy={"doc/p0": EMPTY_ROW})
    result = read(engine, ["doc/p0"])["doc/p0"]
    assert [a["finish_reason"] for a in result.attempts] == ["repetition", "repetition", "stop"]
    assert result.status == "ok"
    assert result.recognition is not None and result.recognition.raw.endswith("</table>")


def test_a_page_that_loops_on_every_rung_fails_after_reading_to_max_tokens() -> None:
    engine = RecordedEngine(greedy={"doc/p0": [*HEAD, *LOOP]})
    result = read(engine, ["doc/p0"])["doc/p0"]
    assert result.status == "failed"
    assert [a["finish_reason"] for a in result.attempts] == ["repetition", "repetition", "length"]
    assert result.attempts[-1]["completion_tokens"] == 4096


def test_the_ban_ladder_is_unchanged_by_the_stop() -> None:
    rungs = deepseek.rungs(EngineConfig())
    assert rungs[0] == Sampling(ngram_size=30, window_size=90)
    assert all(r.stop_pattern == 0 for r in rungs)
    assert (
        deepseek.needs_retry(Recognition(markdown="a", raw="a", finish_reason="repetition"))
        == "loop"
    )
