"""``[engine.vllm]``: the DeepSeek-OCR engine's options, and its prompt presets.

Only pydantic and the sampling defaults: ``config`` composes this model into ``[engine]``, so it
sits at the bottom of the layers with it.
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
    """One rung of ``ladder`` after the first attempt; ``max_tokens`` is the engine's for every
    rung."""

    temperature: Annotated[float, Field(ge=0, le=2)] = Field(
        _DEFAULT.temperature, description="The rung's sampling temperature."
    )
    ngram_size: Annotated[int, Field(ge=0, le=200)] = Field(
        _DEFAULT.ngram_size, description="The rung's no-repeat n-gram size (0 = none)."
    )
    window_size: Annotated[int, Field(ge=0, le=4096)] = Field(
        _DEFAULT.window_size, description="The rung's n-gram window."
    )
    repetition_penalty: Annotated[float, Field(ge=1, le=2)] = Field(
        _DEFAULT.repetition_penalty, description="vLLM's own repetition penalty; 1 = none."
    )


class VllmConfig(_Model):
    """The vLLM DeepSeek-OCR engine's options."""

    model: str = Field(
        "deepseek-ai/DeepSeek-OCR-2",
        description=(
            "Local model directory or hub id: DeepSeek-OCR-2 (DeepseekOCR2ForCausalLM) or "
            "DeepSeek-OCR."
        ),
    )
    revision: str | None = Field(
        None,
        examples=["..."],
        description=("A hub revision (commit) to pin; recorded in every sidecar."),
    )
    tokenizer: str | None = Field(
        None, examples=["..."], description=("A tokenizer other than the model's own.")
    )
    dtype: Literal["auto", "bfloat16", "float16"] = Field(
        "bfloat16", description=("Weights' precision.")
    )
    max_model_len: Annotated[int, Field(ge=256)] = Field(
        8192, description=("Prompt (about 1,130 tokens per page) plus output must fit.")
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        0.9, description=("Fraction of GPU memory vLLM may take (weights + KV cache).")
    )
    max_num_seqs: Annotated[int, Field(ge=1)] | None = Field(
        None,
        examples=[256],
        description=(
            "Sequences decoded together; the scheduler keeps this many pages in flight per "
            "data-parallel rank and replica. Unset (with max_num_batched_tokens): chosen from the "
            "GPU and the model. Per GPU: KV cache = total memory x gpu_memory_utilization - the "
            "weights - 8 GiB; sequences = KV tokens / (the longest page prompt + max_tokens), a "
            "multiple of 8, 8 to 256; batched tokens = 128 x sequences, 8,192 to 32,768. H200 + "
            "DeepSeek-OCR-2: 256 and 32,768 (the fastest measured); 80 GB H100: 184 and 23,552. "
            "Explicit values win."
        ),
    )
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = Field(
        None,
        examples=[32768],
        description=(
            "Token budget per engine step (decode plus new pages' prompts); unset = the rule of "
            "max_num_seqs."
        ),
    )
    block_size: Annotated[int, Field(ge=1)] | None = Field(
        None, examples=[16], description=("KV-cache block size; unset = vLLM's default.")
    )
    enforce_eager: bool | None = Field(
        None,
        examples=[True],
        description=(
            "Skip CUDA graphs and torch.compile (slower, starts faster; for debugging). Unset: "
            "eager where vLLM runs on the CPU, compiled on a GPU."
        ),
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description=("GPUs per model replica (tensor parallelism).")
    )
    data_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description=(
            "vLLM's data parallelism: ranks inside one engine; for DeepSeek-OCR's "
            "mixture-of-experts"
            " decoder they step in lockstep. Pages spread over them."
        ),
    )
    replicas: Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description=(
            "Independent engines, each on its own tensor_parallel_size x data_parallel_size GPUs "
            "(consecutive GPUs of CUDA_VISIBLE_DEVICES, or all); each page goes to the one with "
            "the fewest pages in flight."
        ),
    )
    replica_processes: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Each replica's vLLM front end (input preparation, output handling) in a child "
            "process of"
            " its own instead of all in the daemon's, so they share no GIL (faster with several "
            "GPUs):"
            ' "auto" = when replicas > 1, true, or false.'
        ),
    )
    seed: int = Field(0, description="Sampling seed.")
    load_format: str = Field(
        "auto",
        description=(
            '"auto" loads real weights; "dummy" gives random weights of the real architecture'
            " (benchmarks only)."
        ),
    )
    fast_encoder: bool = Field(
        True,
        description=(
            "ocrwatch's batched DeepSeek-OCR-2 vision encoder (a vLLM plugin, several times faster,"
            " same outputs within bf16 error); false = vLLM's own class. DeepSeek-OCR always runs"
            " vLLM's own class."
        ),
    )
    encoder_cuda_graphs: bool = Field(
        False,
        description=(
            "With fast_encoder: replay the vision encoder as CUDA graphs (captured at start, a few "
            "GiB of GPU memory) instead of launching its kernels one by one from Python."
        ),
    )
    max_tokens: Annotated[int, Field(ge=1)] = Field(
        _DEFAULT.max_tokens,
        description=(
            "Output tokens per page at most; a page that hits it is retried on the next rung."
        ),
    )
    ngram_size: Annotated[int, Field(ge=0, le=200)] = Field(
        _DEFAULT.ngram_size,
        description=(
            "No-repeat n-gram guard of DeepSeek-OCR: n-gram size (0 = off here and in every rung: "
            "no guard; looping pages are then caught by the loop detector and retried on the "
            "ladder)."
        ),
    )
    window_size: Annotated[int, Field(ge=0, le=4096)] = Field(
        _DEFAULT.window_size, description=("The n-gram guard's window (0 = off, as ngram_size).")
    )
    whitelist_token_ids: tuple[int, ...] = Field(
        (128821, 128822),
        description=(
            "Token ids exempt from the n-gram guard: <td> and </td>, which tables repeat "
            "legitimately."
        ),
    )
    ngram_processor: Literal["batched", "gpu", "per_request"] = Field(
        "gpu",
        description=(
            'How the n-gram guard runs, same bans: "gpu" (one kernel inside vLLM\'s V2 sampler; a'
            " one-GPU engine then asks vLLM for its V2 runner, which vLLM 0.26 does not choose for"
            " DeepSeek-OCR(-2) itself: measured faster, same output; where vLLM still runs V1, e.g."
            ' VLLM_USE_V2_MODEL_RUNNER=0, it falls back to "batched"), "batched" (a logits'
            ' processor on the V1 runner: the whole batch in one NumPy pass) or "per_request"'
            " (vLLM's NGramPerReqLogitsProcessor: a Python loop per sequence and step)."
        ),
    )
    guard: Literal["ban", "stop"] = Field(
        "ban",
        description=(
            'What the first attempt at a page does against loops: "ban" (the n-gram guard above,'
            " DeepSeek's rule, a logits processor: on vLLM 0.26's V1 runner every decode step of "
            "every"
            ' page waits for the host) or "stop" (no logits processor: vLLM\'s scheduler ends an'
            " attempt whose output ends in a pattern of at most stop_pattern tokens repeated "
            "stop_count"
            " times, and only those pages are read again, the ladder's rungs with their "
            "temperature and"
            " repetition_penalty instead of an n-gram ban; the last rung reads to the end)."
        ),
    )
    stop_pattern: Annotated[int, Field(ge=1, le=256)] = Field(
        32, description=('guard = "stop": the longest repeated pattern, in tokens.')
    )
    stop_count: Annotated[int, Field(ge=2, le=1000)] = Field(
        16, description=('guard = "stop": repeats of the pattern that end an attempt.')
    )
    priority_lanes: bool = Field(
        False,
        description=(
            "Make room inside vLLM's scheduler for pages of a better inbox priority: when one "
            "waits, a page of the worst lane is preempted, and worse lanes are held to an eighth "
            "of the batch while it runs (a patch of vLLM 0.26's scheduler, installed by ocrwatch's "
            "vLLM plugin). Off by default: its preemption path has not yet run on a GPU with mixed "
            "priorities. ocrwatch's own page scheduler holds worse lanes back either way."
        ),
    )
    ladder: tuple[SamplingRung, ...] = Field(
        (
            SamplingRung(temperature=0.1, ngram_size=20, window_size=90, repetition_penalty=1.05),
            SamplingRung(temperature=0.2, ngram_size=12, window_size=120, repetition_penalty=1.1),
        ),
        description=(
            "Retry ladder after the first attempt: each rung changes the sampling; [engine]"
            " page_attempts counts the first attempt and these rungs."
        ),
    )
    ignore_eos: bool = Field(
        False, description=("Force every page to max_tokens (benchmarks with random weights only).")
    )
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Custom prompt presets by name, usable as an inbox's prompt; built in: markdown, free, "
            "figure."
        ),
    )
    compile_cache_dir: Path | None = Field(
        None,
        examples=["/var/cache/ocrwatch/vllm"],
        description=(
            "vLLM's compile cache (systemd CacheDirectory=); unset = vLLM's default"
            " (~/.cache/vllm)."
        ),
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description=("Anything else passed straight to vLLM's engine arguments, last (it wins)."),
    )

    def prompt(self, preset: str) -> str | None:
        """The text of ``preset``: a custom one of ``prompts``, else a built-in; None: unknown."""
        return self.prompts.get(preset) or PROMPT_PRESETS.get(preset)

    def presets(self) -> set[str]:
        """Every preset a source may name."""
        return set(PROMPT_PRESETS) | set(self.prompts)

    def first_rung(self) -> Sampling:
        """The first attempt at every page: greedy, with the guard ``guard`` names. ``ban``:
        DeepSeek-OCR's no-repeat n-gram rule, a logits processor (on vLLM 0.26's V1 runner every
        decode step then waits for the host); ``stop``: no processor, vLLM's scheduler ends an
        attempt that repeats itself and the ladder re-reads only those pages (``rungs.rungs``)."""
        if self.guard == "stop":
            return Sampling(
                ngram_size=0,
                window_size=0,
                max_tokens=self.max_tokens,
                stop_pattern=self.stop_pattern,
                stop_count=self.stop_count,
            )
        return Sampling(
            ngram_size=self.ngram_size, window_size=self.window_size, max_tokens=self.max_tokens
        )

    @property
    def in_processes(self) -> bool:
        """Whether each replica's engine runs in a process of its own. ``auto`` does when there are
        several: each replica's front end (input preparation, output handling) then gets a GIL of
        its own, which was measured faster on two GPUs; one engine gained nothing from a process of
        its own."""
        return self.replicas > 1 if self.replica_processes == "auto" else self.replica_processes
