"""vLLM general plugin (entry point ``vllm.general_plugins``: ``ocrwatch_deepseek_ocr2``).

vLLM calls ``register()`` in every process it starts (the front end, the engine core, the workers),
so the engine's configuration reaches them as environment variables, which those processes inherit;
only the engine (``engine_env``, from ``[engine.vllm] fast_encoder`` and ``encoder_cuda_graphs``)
sets them. ``OCRWATCH_FAST_ENCODER=1`` makes vLLM build
``ocrwatch.engines.deepseek.encoder.FastDeepseekOCR2ForCausalLM`` wherever a model config names
``DeepseekOCR2ForCausalLM``; unset, ``0``, ``false`` or ``no``: nothing is registered and vLLM runs
its own class. The class is registered by name (``module:Class``), so this import stays cheap and
initialises no CUDA. ``OCRWATCH_NGRAM_GPU=1`` adds the n-gram guard to vLLM's V2 sampler
(``ngram_gpu``); ``OCRWATCH_LANES=1`` makes vLLM's scheduler give better priority lanes room
(``lanes``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV = "OCRWATCH_FAST_ENCODER"
GRAPHS_ENV = "OCRWATCH_ENCODER_GRAPHS"
"""Read by the fast class (``encoder``), which imports torch; named here so the engine sets it
without importing torch."""
NGRAM_ENV = "OCRWATCH_NGRAM_GPU"
LANES_ENV = "OCRWATCH_LANES"
ARCH = "DeepseekOCR2ForCausalLM"
FAST_CLASS = "ocrwatch.engines.deepseek.encoder:FastDeepseekOCR2ForCausalLM"


def enabled(environ: Mapping[str, str] | None = None, name: str = ENV) -> bool:
    """Whether the switch ``name`` is on in ``environ`` (default: this process's environment)."""
    value = (environ if environ is not None else os.environ).get(name, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def register() -> None:
    """Register the fast DeepSeek-OCR-2 class with vLLM's model registry, the GPU n-gram guard and
    the lanes, each when enabled; idempotent."""
    if enabled():
        from vllm import ModelRegistry

        ModelRegistry.register_model(ARCH, FAST_CLASS)
    if enabled(name=NGRAM_ENV):
        from ocrwatch.engines.deepseek import ngram_gpu

        ngram_gpu.install()
    if enabled(name=LANES_ENV):
        from ocrwatch.engines.deepseek.experimental import lanes

        lanes.install()
