"""What the engine's settings make of vLLM's arguments: the engine, its environment, each request's
sampling. Pure functions of the configuration, tested without vLLM (``engine.py`` runs them)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ocrwatch.engines.deepseek import plugin, sizing
from ocrwatch.engines.deepseek.geometry import (
    VISIONS,
    VisionGeometry,
    model_architecture,
    model_config,
)
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.deepseek.platform import CUDA, Platform, enforce_eager, v2_runner
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import ConfigError

NGRAM_PROCESSORS = {
    "batched": "ocrwatch.engines.deepseek.ngram_vllm:BatchedNoRepeatNGram",
    "per_request": "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor",
}


IMAGE_TOKEN = "<image>"


RENDERER_WORKERS = 4


MOE_CONFIGS = Path(__file__).with_name("moe_configs")


def vision(cfg: VllmConfig) -> VisionGeometry:
    """How the configured model sees a page."""
    return VISIONS[model_architecture(cfg.model)]


def engine_sizing(cfg: VllmConfig, platform: Platform | None) -> sizing.Sizing:
    """``max_num_seqs`` and ``max_num_batched_tokens``: the config's, else the rule of ``sizing``
    for this model on ``platform``'s GPU, or from the host's memory where vLLM runs on the CPU;
    ``None``: not known yet (a GPU of unknown memory)."""
    language = model_config(cfg.model).get("language_config")
    facts = sizing.model_facts(
        language if isinstance(language, dict) else None, vision(cfg).max_image_tokens()
    )
    if platform is not None and platform.device != CUDA:
        return sizing.resolve_host(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            host_bytes=platform.memory_bytes,
            facts=facts,
            max_tokens=cfg.max_tokens,
            max_model_len=cfg.max_model_len,
        )
    return sizing.resolve(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        gpu_bytes=None if platform is None else platform.memory_bytes,
        utilization=cfg.gpu_memory_utilization,
        facts=facts,
        max_tokens=cfg.max_tokens,
        max_model_len=cfg.max_model_len,
        tensor_parallel=cfg.tensor_parallel_size,
    )


def engine_env(cfg: VllmConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment for vLLM, given the current one: spawn (the daemon is multi-threaded, so forking
    the engine core is unsafe), one OpenMP thread per torch call and no usage reporting unless the
    user chose otherwise; the fast encoder's switches (``[engine.vllm] fast_encoder`` and
    ``encoder_cuda_graphs``), which ``plugin`` and the fast class read in every vLLM process, since
    vLLM's engine core and workers are processes of their own; the compile cache where the config
    puts it.

    One OpenMP thread: vLLM does so for its multi-GPU workers but not for a one-GPU engine core, and
    the daemon's input-preparation threads each ran torch ops over every core at once, which made
    input preparation several times slower on a many-core host and capped the daemon's throughput.

    ``VLLM_TUNED_CONFIG_FOLDER``: the fused-MoE tiles tuned for DeepSeek-OCR's experts
    (``MOE_CONFIGS``); vLLM has none for that shape and falls back to generic tiles. The n-gram
    guard on the GPU (``ngram_processor = "gpu"``) and the priority lanes (``lanes``,
    ``priority_lanes``) are switched on the same way.

    The model runner follows the platform: ``platform_env``, once vLLM is imported."""
    defaults = {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_NO_USAGE_STATS": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_TUNED_CONFIG_FOLDER": str(MOE_CONFIGS),
    }
    env = {key: value for key, value in defaults.items() if key not in environ}
    env[plugin.ENV] = "1" if cfg.fast_encoder else "0"
    env[plugin.GRAPHS_ENV] = "1" if cfg.fast_encoder and cfg.encoder_cuda_graphs else "0"
    env[plugin.NGRAM_ENV] = "1" if uses_ngram_guard(cfg) and cfg.ngram_processor == "gpu" else "0"
    env[plugin.LANES_ENV] = "1" if cfg.priority_lanes else "0"
    if cfg.compile_cache_dir is not None:
        env["VLLM_CACHE_ROOT"] = str(cfg.compile_cache_dir.expanduser())
    return env


def host_processor(cfg: VllmConfig) -> bool:
    """A logits processor runs on the host (the V2 model runner refuses one)."""
    return uses_ngram_guard(cfg) and cfg.ngram_processor in NGRAM_PROCESSORS


def platform_env(cfg: VllmConfig, platform: Platform, environ: Mapping[str, str]) -> dict[str, str]:
    """What the platform adds to ``engine_env`` before the engine is built, unless the user set it.

    ``VLLM_USE_V2_MODEL_RUNNER``: vLLM 0.26 keeps mixture-of-experts models such as DeepSeek-OCR(-2)
    on its V1 runner unless asked. On one H200 its V2 runner gave the same greedy output ids (64
    pages, 1,000 tokens each) and was faster in every lane measured (docs/performance.md,
    2026-12-01: 12.65 against 9.91 pages/s with the guard off, 11.43 with the guard as one kernel in
    its sampler against 9.06 with it on the host), so a one-GPU engine without a custom logits
    processor (which the V2 runner refuses) asks for it; several GPUs were not measured on it and
    keep vLLM's choice, and so does the CPU, where the V2 runner needs Triton
    (``platform.v2_runner``)."""
    if "VLLM_USE_V2_MODEL_RUNNER" in environ:
        return {}
    if v2_runner(cfg, platform, host_processor=host_processor(cfg)):
        return {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    return {}


def engine_kwargs(
    cfg: VllmConfig,
    sizes: sizing.Sizing | None = None,
    *,
    processor: str | None = None,
    platform: Platform | None = None,
) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments: vLLM's DeepSeek-OCR recipe, the sizes (default: the
    config's or the fallback, for a GPU of unknown memory), then ``[engine.vllm.engine_args]``.
    ``processor``: the n-gram guard's logits processor instead of the configured one (the engine
    falls back to ``batched`` where vLLM does not choose its V2 runner, which ``gpu`` needs).
    ``platform`` (None: a GPU) decides ``enforce_eager`` where the config leaves it unset; the
    CPU's KV cache is asked in bytes (``kv_cache_memory_bytes``), so vLLM's CPU backend does not
    reserve ``gpu_memory_utilization`` of the host's memory, which it refuses to start without."""
    sizes = sizes or engine_sizing(cfg, platform)
    platform = platform or Platform(CUDA, None)
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": sizes.max_num_seqs,
        "max_num_batched_tokens": sizes.max_num_batched_tokens,
        "enforce_eager": enforce_eager(cfg, platform),
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "data_parallel_size": cfg.data_parallel_size,
        "seed": cfg.seed,
        "load_format": cfg.load_format,
        "enable_prefix_caching": False,
        "mm_processor_cache_gb": 0,
        "scheduling_policy": "priority",
        "limit_mm_per_prompt": {"image": 1},
        "renderer_num_workers": RENDERER_WORKERS,
    }
    optional = {
        "revision": cfg.revision,
        "tokenizer": cfg.tokenizer,
        "block_size": cfg.block_size,
    }
    kwargs.update({key: value for key, value in optional.items() if value is not None})
    if sizes.kv_cache_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = sizes.kv_cache_bytes
    processor = processor or cfg.ngram_processor
    if uses_ngram_guard(cfg) and processor in NGRAM_PROCESSORS:
        kwargs["logits_processors"] = [NGRAM_PROCESSORS[processor]]
    kwargs.update(cfg.engine_args)
    if kwargs["mm_processor_cache_gb"] and "renderer_num_workers" not in cfg.engine_args:
        kwargs["renderer_num_workers"] = 1
    return kwargs


@contextmanager
def visible_devices(devices: str | None) -> Iterator[None]:
    """vLLM's engine core is a spawned process that reads ``CUDA_VISIBLE_DEVICES`` when it starts
    (vLLM pins its own data-parallel ranks the same way), so a replica is pinned by the variable
    while it is built; ``None`` leaves the environment as it is."""
    if devices is None:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def uses_ngram_guard(cfg: VllmConfig) -> bool:
    """Any custom logits processor moves vLLM (0.26) from its V2 model runner to the older V1 one,
    whose host work per decode step makes a step half as long again on an H200, so none is
    registered when no rung can use the guard, nor for ``ngram_processor = "gpu"`` (``ngram_gpu``,
    inside the V2 runner), nor for ``guard = "stop"``, whose rungs never ban n-grams
    (``rungs.rungs``)."""
    if cfg.guard == "stop":
        return False
    rungs = [
        (cfg.ngram_size, cfg.window_size),
        *((r.ngram_size, r.window_size) for r in cfg.ladder),
    ]
    return any(n > 0 and w > 0 for n, w in rungs)


def check_engine_args(kwargs: Mapping[str, Any], known: set[str], version: str) -> None:
    """Engine arguments differ between vLLM releases (0.33 dropped ``max_num_partial_prefills``,
    ``calculate_kv_scales`` and others): name the ones this vLLM lacks instead of a bare
    ``TypeError``."""
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(
            f"engine.vllm.engine_args: vLLM {version} has no engine argument "
            f"{', '.join(map(repr, unknown))}",
            hint="remove it from [engine.vllm.engine_args] or install the vLLM release it belongs "
            "to",
        )


def sampling_kwargs(cfg: VllmConfig, sampling: Sampling) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one rung; the n-gram settings travel in
    ``extra_args`` to DeepSeek-OCR's ``NGramPerReqLogitsProcessor`` (off when ``ngram_size`` or
    ``window_size`` is 0); the repetition stop as the fields of vLLM's ``RepetitionDetectionParams``
    (``_Runtime.sampling_params`` builds it: this function imports nothing of vLLM)."""
    kwargs: dict[str, Any] = {
        "temperature": sampling.temperature,
        "max_tokens": sampling.max_tokens,
        "skip_special_tokens": False,
        "ignore_eos": cfg.ignore_eos,
    }
    if sampling.temperature > 0:
        kwargs["seed"] = cfg.seed
    if sampling.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = sampling.repetition_penalty
    if sampling.stop_pattern > 0 and sampling.stop_count > 1:
        kwargs["repetition_detection"] = {
            "max_pattern_size": sampling.stop_pattern,
            "min_count": sampling.stop_count,
        }
    if sampling.ngram_size > 0 and sampling.window_size > 0:
        kwargs["extra_args"] = {
            "ngram_size": sampling.ngram_size,
            "window_size": sampling.window_size,
            "whitelist_token_ids": list(cfg.whitelist_token_ids),
        }
    return kwargs


def vllm_priority(priority: int) -> int:
    """``PageRequest.priority`` is the scheduler's ``engine_priority``: lower runs first, as in
    vLLM's priority scheduler (``Request.__lt__``: priority, then arrival), so it passes unchanged;
    its values (up to about 10**10) fit the 64-bit integers of vLLM's msgpack transport."""
    return priority


def model_prompt(prompt: str) -> str:
    """DeepSeek-OCR needs exactly one image tag; a custom prompt without one gets it in front."""
    return prompt if IMAGE_TOKEN in prompt else f"{IMAGE_TOKEN}\n{prompt}"
