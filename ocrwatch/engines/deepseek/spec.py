"""The ``vllm`` engine as the registry builds it (entry point ``ocrwatch.engines: vllm``): one
``VllmEngine``, or with ``[engine.vllm] replicas`` > 1 one per group of GPUs behind ``EngineSet``,
each in this process or in a child process of its own (``replica_processes``).
"""

from __future__ import annotations

import os

from ocrwatch.config import EngineConfig, LogConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import Engine, EngineSpec, Images
from ocrwatch.engines.deepseek import checks, rungs
from ocrwatch.engines.deepseek.engine import VllmEngine
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.process import ProcessEngine
from ocrwatch.engines.replicas import EngineSet
from ocrwatch.errors import ConfigError


def replica_devices(cfg: VllmConfig, visible: str | None, count: int) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` for each replica: consecutive groups of ``tensor_parallel_size ×
    data_parallel_size`` of the GPUs this process may use (its own ``CUDA_VISIBLE_DEVICES``, else
    all ``count``); one replica inherits the environment unchanged."""
    if cfg.replicas == 1:
        return [None]
    ids = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible
        else [str(i) for i in range(count)]
    )
    per = cfg.tensor_parallel_size * cfg.data_parallel_size
    if cfg.replicas * per > len(ids):
        raise ConfigError(
            f"engine.vllm.replicas: {cfg.replicas} replicas of {per} GPU(s) need "
            f"{cfg.replicas * per} GPUs, "
            f"{len(ids)} visible",
            hint="lower replicas (or tensor_parallel_size × data_parallel_size), or make more "
            "GPUs visible",
        )
    return [",".join(ids[i * per : (i + 1) * per]) for i in range(cfg.replicas)]


def _visible(devices: str | None) -> dict[str, str]:
    """A replica process's GPUs; one replica (``None``) inherits the daemon's."""
    return {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}


def build(cfg: EngineConfig, images: Images, log: LogConfig | None) -> Engine:
    """The engine ``[engine.vllm]`` describes, built but not started: vLLM is imported only at its
    start."""
    if not cfg.vllm.in_processes and cfg.vllm.replicas == 1:
        return VllmEngine(cfg.vllm, images=images)
    one = cfg.vllm.model_copy(update={"replicas": 1, "replica_processes": False})
    groups = replica_devices(cfg.vllm, os.environ.get("CUDA_VISIBLE_DEVICES"), registry.gpu_count())
    if cfg.vllm.in_processes:
        single = cfg.model_copy(update={"vllm": one})
        return EngineSet(
            [
                ProcessEngine("vllm", single, images, env=_visible(group), log_config=log)
                for group in groups
            ]
        )
    return EngineSet(
        [VllmEngine(one, images=images, devices=group) for group in groups], count_as="replicas"
    )


SPEC = EngineSpec(  # its Markdown keeps tables and headings: text "ocr"
    "vllm",
    build,
    text="ocr",
    options=VllmConfig,
    checks=checks.checks,
    trial="none",
    rungs=rungs.rungs,
    judge=rungs.judge,
    auto=0,  # tried first by auto: the GPU engine, where it can run
    runs_here=checks.runs_here,
    installed=checks.installed,
)
