"""Which engine runs, and why: ``[engine] kind`` resolved into a built (not yet started) engine.

``auto`` picks vLLM only when vllm imports and torch sees a CUDA device, otherwise Tesseract; the reason
is returned so the daemon can say it loudly. Engines are imported only when chosen, so a machine without
vllm or torch never imports them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from typing import Any, Literal

from ocrwatch.config import EngineConfig, LogConfig
from ocrwatch.engines.base import Engine
from ocrwatch.errors import ConfigError


def _vllm_status() -> tuple[bool, str]:
    """Whether the vLLM engine can run here, and why (not)."""
    try:
        vllm = importlib.import_module("vllm")
    except ModuleNotFoundError as exc:
        if exc.name == "vllm":
            return False, "vllm is not installed"
        return False, f"vllm does not import: {exc}"
    except Exception as exc:
        return False, f"vllm does not import: {type(exc).__name__}: {exc}"
    version = getattr(vllm, "__version__", "?")
    try:
        torch = importlib.import_module("torch")
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        return False, f"vllm {version} imports but torch cannot look for CUDA devices: {exc}"
    if devices == 0:
        return False, f"vllm {version} imports but no CUDA device is visible"
    return True, f"vllm {version} imports and {devices} CUDA device(s) are visible"


def choose(cfg: EngineConfig) -> tuple[str, str]:
    """The engine kind to build and the human reason for it."""
    if cfg.kind != "auto":
        return cfg.kind, f"[engine] kind = {cfg.kind!r} in the configuration"
    available, why = _vllm_status()
    if available:
        return "vllm", f"[engine] kind = 'auto': {why}"
    return "tesseract", f"[engine] kind = 'auto': {why}, so Tesseract runs on the CPU"


def load_plugin(spec: str, args: dict[str, Any]) -> Engine:
    """Build an engine from ``"module:attribute"`` called with ``args`` as keyword arguments."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"engine.plugin: {spec!r} is not of the form 'module:attribute'")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"engine.plugin: cannot load {spec!r}: {exc}") from None
    try:
        engine = factory(**args)
    except TypeError as exc:
        raise ConfigError(f"engine.plugin_args: {spec!r} rejects them: {exc}") from None
    if not isinstance(engine, Engine):
        raise ConfigError(f"engine.plugin: {spec!r} did not build an engine (missing parts of the Engine protocol)")
    return engine


def gpu_count(proc: str = "/proc/driver/nvidia/gpus", dev: str = "/dev") -> int:
    """GPUs the NVIDIA driver lists, read without importing torch (which would stall the event loop).

    A container often has the device nodes (``/dev/nvidia0`` …) but not the driver's ``/proc`` folder, so the
    nodes count too."""
    counts = []
    with contextlib.suppress(OSError):
        counts.append(len(os.listdir(proc)))
    with contextlib.suppress(OSError):
        counts.append(sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name)))
    return max(counts, default=0)


def _visible(devices: str | None) -> dict[str, str]:
    """A replica process's GPUs; one replica (``None``) inherits the daemon's."""
    return {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}


def build(
    cfg: EngineConfig,
    output_images: Literal["placeholder", "drop"] = "placeholder",
    *,
    kind: str | None = None,
    log: LogConfig | None = None,
) -> Engine:
    """The engine of ``kind`` (default: ``choose(cfg)``), built but not started; ``log`` is passed to engines
    that run in processes of their own."""
    kind = kind or choose(cfg)[0]
    if kind == "vllm" and cfg.vllm.in_processes:
        from ocrwatch.engines.process import EngineSet, ProcessEngine
        from ocrwatch.engines.vllm import replica_devices

        single = cfg.model_copy(update={"vllm": cfg.vllm.model_copy(update={"replicas": 1, "replica_processes": False})})
        devices = replica_devices(cfg.vllm, os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_count())
        return EngineSet(
            [
                ProcessEngine("vllm", single, output_images, env=_visible(group), log_config=log)
                for group in devices
            ]
        )
    if kind == "vllm":
        from ocrwatch.engines.vllm import VllmEngine

        return VllmEngine(cfg.vllm, images=output_images)
    if kind == "tesseract":
        from ocrwatch.engines.tesseract import TesseractEngine

        return TesseractEngine(cfg.tesseract)
    if kind == "plugin":
        if not cfg.plugin:
            raise ConfigError("engine.plugin: kind = 'plugin' needs plugin = 'module:attribute'")
        return load_plugin(cfg.plugin, dict(cfg.plugin_args))
    raise ConfigError(f"engine.kind: unknown engine {kind!r}")
