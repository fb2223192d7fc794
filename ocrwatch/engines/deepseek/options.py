"""``[engine.vllm]``: the DeepSeek-OCR engine's options, and its prompt presets.

Only pydantic and the sampling defaults: ``config`` composes this model into ``[engine]``, so it sits at the
bottom of the layers with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ocrwatch.engines.sampling import Sampling

PROMPT_PRESETS: dict[str, str] = {
    "markdown": "<image>\n<|grounding|>Convert the document to markdown.",
    "free": "<image>\nFree OCR.",
    "figure": "<image>\nParse the figure.",
}

_DEFAULT = Sampling()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingRung(_Model):
    """One rung of ``ladder`` after the first attempt; ``max_tokens`` is the engine's for every rung."""

    temperature: Annotated[float, Field(ge=0, le=2)] = _DEFAULT.temperature
    ngram_size: Annotated[int, Field(ge=0, le=200)] = _DEFAULT.ngram_size
    window_size: Annotated[int, Field(ge=0, le=4096)] = _DEFAULT.window_size
    repetition_penalty: Annotated[float, Field(ge=1, le=2)] = _DEFAULT.repetition_penalty


class VllmConfig(_Model):
    model: str = "deepseek-ai/DeepSeek-OCR-2"
    revision: str | None = None
    tokenizer: str | None = None
    dtype: Literal["auto", "bfloat16", "float16"] = "bfloat16"
    max_model_len: Annotated[int, Field(ge=256)] = 8192
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = None
    block_size: Annotated[int, Field(ge=1)] | None = None
    enforce_eager: bool = False
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    data_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    replicas: Annotated[int, Field(ge=1, le=64)] = 1
    replica_processes: bool | Literal["auto"] = "auto"
    seed: int = 0
    load_format: str = "auto"
    fast_encoder: bool = True
    encoder_cuda_graphs: bool = False
    max_tokens: Annotated[int, Field(ge=1)] = _DEFAULT.max_tokens
    ngram_size: Annotated[int, Field(ge=0, le=200)] = _DEFAULT.ngram_size
    window_size: Annotated[int, Field(ge=0, le=4096)] = _DEFAULT.window_size
    whitelist_token_ids: tuple[int, ...] = (128821, 128822)
    ngram_processor: Literal["batched", "gpu", "per_request"] = "gpu"
    guard: Literal["ban", "stop"] = "ban"
    stop_pattern: Annotated[int, Field(ge=1, le=256)] = 32
    stop_count: Annotated[int, Field(ge=2, le=1000)] = 16
    priority_lanes: bool = False
    ladder: tuple[SamplingRung, ...] = (
        SamplingRung(temperature=0.1, ngram_size=20, window_size=90, repetition_penalty=1.05),
        SamplingRung(temperature=0.2, ngram_size=12, window_size=120, repetition_penalty=1.1),
    )
    ignore_eos: bool = False
    prompts: dict[str, str] = Field(default_factory=dict)
    compile_cache_dir: Path | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)

    def first_rung(self) -> Sampling:
        """The first attempt at every page: greedy, with the guard ``guard`` names. ``ban``: DeepSeek-OCR's
        no-repeat n-gram rule, a logits processor (on vLLM 0.26's V1 runner every decode step then waits for
        the host); ``stop``: no processor, vLLM's scheduler ends an attempt that repeats itself and the ladder
        re-reads only those pages (``ladder.rungs``)."""
        if self.guard == "stop":
            return Sampling(
                ngram_size=0,
                window_size=0,
                max_tokens=self.max_tokens,
                stop_pattern=self.stop_pattern,
                stop_count=self.stop_count,
            )
        return Sampling(ngram_size=self.ngram_size, window_size=self.window_size, max_tokens=self.max_tokens)

    @property
    def in_processes(self) -> bool:
        """Whether each replica's engine runs in a process of its own. ``auto`` does when there are several:
        each replica's front end (input preparation, output handling) then gets a GIL of its own, which was
        measured faster on two GPUs; one engine gained nothing from a process of its own."""
        return self.replicas > 1 if self.replica_processes == "auto" else self.replica_processes
