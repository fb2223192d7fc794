"""``max_num_seqs`` and ``max_num_batched_tokens`` chosen from the GPU and the model when
``[engine.vllm]`` leaves them unset; explicit values win. Pure functions: the GPU's memory is read
by the engine (NVML through vLLM) and passed in.

The rule, per GPU of one replica (tensor parallelism splits the weights and the KV cache):

1. KV-cache bytes = total GPU memory × ``gpu_memory_utilization`` − the weights − ``RESERVE_BYTES``
   (activations, CUDA graphs, the vision encoder's working memory, the sampler). The weights are
   counted from the model's ``config.json`` (DeepSeek-OCR and DeepSeek-OCR-2 share the same 3B
   mixture-of-experts decoder) plus ``VISION_PARAMS`` for the vision tower, two bytes each.
2. KV tokens = those bytes / (2 × layers × KV heads × head size × 2 bytes).
3. Sequences = KV tokens / (the longest page prompt + ``max_tokens``, at most ``max_model_len``):
   every page in flight can reach its token limit without vLLM preempting another. Rounded down to a
   multiple of 8, then bounded to 8–``MAX_SEQS``.
4. Batched tokens = ``TOKENS_PER_SEQ`` × sequences, bounded to 8,192–32,768: one token per sequence
   for the decode step, the rest admits new pages (about 1,130 prompt tokens each for
   DeepSeek-OCR-2), so a full batch is refilled in about nine steps.

On an H200 (140 GiB) with DeepSeek-OCR-2 and the default ``max_tokens = 4096``: 112 GiB of KV cache,
1.96 M tokens, 374 sequences → 256 sequences and 32,768 batched tokens, the fastest set-up measured
(256 is the largest batch measured, hence the cap). On an 80 GB H100: 184 and 23,552. Unknown GPU
memory (no NVML): ``FALLBACK_SEQS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30
RESERVE_BYTES = 8 * GIB
VISION_PARAMS = 500_000_000
"""SAM ViT-B plus DeepSeek-OCR-2's Qwen2 encoder (about 0.46 B) or DeepSeek-OCR's CLIP-L (about 0.40
B)."""
BYTES_PER_PARAM = 2  # bf16 / fp16
MAX_SEQS = 256
MIN_SEQS = 8
SEQ_STEP = 8
TOKENS_PER_SEQ = 128
MIN_BATCHED = 8192
MAX_BATCHED = 32768
FALLBACK_SEQS = 128
HOST_MAX_SEQS = 8
"""On the CPU: a few cores decode a handful of pages as fast as many."""
HOST_KV_FRACTION = 0.25
"""Of the host's available memory, for the KV cache: the weights, the vision encoder's working
memory and the daemon's pages need the rest."""
PROMPT_TEXT_TOKENS = 32
"""The prompt's text around the image tokens (the longest preset is about 15 tokens)."""

PUBLISHED_LANGUAGE_CONFIG: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 1280,
    "intermediate_size": 6848,
    "moe_intermediate_size": 896,
    "num_hidden_layers": 12,
    "num_attention_heads": 10,
    "num_key_value_heads": 10,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
}
"""The decoder of DeepSeek-OCR and DeepSeek-OCR-2 as published (``language_config``), for a hub
id."""


@dataclass(frozen=True)
class ModelFacts:
    weight_bytes: int
    kv_bytes_per_token: int
    max_prompt_tokens: int


@dataclass(frozen=True)
class Sizing:
    max_num_seqs: int
    max_num_batched_tokens: int
    source: str
    """``config`` (both set), ``auto`` (the rule), ``fallback`` (GPU memory unknown), ``mixed``,
    ``host`` (no GPU: ``resolve_host``)."""
    kv_cache_bytes: int | None = None
    """The KV cache asked of vLLM in bytes (the CPU only; on a GPU vLLM sizes it from
    ``gpu_memory_utilization``)."""


def model_facts(language_config: Mapping[str, Any] | None, max_image_tokens: int) -> ModelFacts:
    """Weights and KV bytes per token of a DeepSeek-V2 decoder without MLA, as vLLM builds it (head
    size = hidden / heads), plus the vision tower; the longest prompt is the image tokens plus the
    text."""
    lc = {**PUBLISHED_LANGUAGE_CONFIG, **(language_config or {})}
    hidden, layers = int(lc["hidden_size"]), int(lc["num_hidden_layers"])
    heads = int(lc["num_attention_heads"])
    kv_heads = int(lc.get("num_key_value_heads") or heads)
    head_dim = hidden // heads
    dense = min(int(lc.get("first_k_dense_replace") or 0), layers)
    experts = int(lc.get("n_routed_experts") or 0)
    moe_layer = (
        (experts + int(lc.get("n_shared_experts") or 0))
        * 3
        * hidden
        * int(lc["moe_intermediate_size"])
    )
    params = (
        2 * int(lc["vocab_size"]) * hidden
        + layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim)
        + dense * 3 * hidden * int(lc["intermediate_size"])
        + (layers - dense) * (moe_layer + hidden * experts)
        + VISION_PARAMS
    )
    return ModelFacts(
        weight_bytes=params * BYTES_PER_PARAM,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * BYTES_PER_PARAM,
        max_prompt_tokens=max_image_tokens + PROMPT_TEXT_TOKENS,
    )


def auto_seqs(
    gpu_bytes: int,
    utilization: float,
    facts: ModelFacts,
    max_tokens: int,
    max_model_len: int,
    tensor_parallel: int,
) -> int:
    """Steps 1-3 of the rule."""
    kv_bytes = gpu_bytes * utilization - facts.weight_bytes / tensor_parallel - RESERVE_BYTES
    kv_tokens = max(kv_bytes, 0) / (facts.kv_bytes_per_token / tensor_parallel)
    per_seq = min(facts.max_prompt_tokens + max_tokens, max_model_len)
    seqs = int(kv_tokens // per_seq) // SEQ_STEP * SEQ_STEP
    return max(MIN_SEQS, min(MAX_SEQS, seqs))


def auto_batched_tokens(seqs: int) -> int:
    """Step 4 of the rule."""
    return max(MIN_BATCHED, min(MAX_BATCHED, TOKENS_PER_SEQ * seqs))


def resolve(
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    gpu_bytes: int | None,
    utilization: float,
    facts: ModelFacts,
    max_tokens: int,
    max_model_len: int,
    tensor_parallel: int = 1,
) -> Sizing:
    """The engine's two sizes: explicit values win, the rule fills the rest."""
    if max_num_seqs is not None and max_num_batched_tokens is not None:
        return Sizing(max_num_seqs, max_num_batched_tokens, "config")
    if max_num_seqs is not None:
        seqs, source = max_num_seqs, "mixed"
    elif gpu_bytes:
        seqs = auto_seqs(gpu_bytes, utilization, facts, max_tokens, max_model_len, tensor_parallel)
        source = "auto" if max_num_batched_tokens is None else "mixed"
    else:
        seqs, source = FALLBACK_SEQS, "fallback"
    batched = (
        max_num_batched_tokens if max_num_batched_tokens is not None else auto_batched_tokens(seqs)
    )
    return Sizing(seqs, batched, source)


def resolve_host(
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    host_bytes: int | None,
    facts: ModelFacts,
    max_tokens: int,
    max_model_len: int,
) -> Sizing:
    """The sizes where vLLM runs on the host's CPU: sequences as many as ``HOST_KV_FRACTION`` of the
    available memory holds, 1 to ``HOST_MAX_SEQS``; batched tokens one page's longest prompt plus a
    decode token per sequence, so vLLM profiles the vision encoder on one image of the largest size
    (not the GPU rule's dozens); the KV cache those sequences need, at least one ``max_model_len``
    sequence (vLLM refuses less). Explicit values win."""
    per_seq = min(facts.max_prompt_tokens + max_tokens, max_model_len)
    if max_num_seqs is not None:
        seqs = max_num_seqs
    else:
        budget = (host_bytes or 0) * HOST_KV_FRACTION
        seqs = max(1, min(HOST_MAX_SEQS, int(budget // (per_seq * facts.kv_bytes_per_token))))
    batched = (
        max_num_batched_tokens
        if max_num_batched_tokens is not None
        else facts.max_prompt_tokens + seqs
    )
    kv_tokens = max(seqs * per_seq, max_model_len)
    source = "config" if max_num_seqs is not None and max_num_batched_tokens is not None else "host"
    return Sizing(seqs, batched, source, kv_tokens * facts.kv_bytes_per_token)
