"""Which engine runs, and why: ``[engine] kind`` resolved into a built (not yet started) engine.

Engines are found by name in the ``ocrwatch.engines`` entry-point group, as OCRmyPDF finds its
plugins and gunicorn its workers; the built-in ones (``tesseract``, ``vllm``, ``plugin``) are
registered there too, in pyproject.toml. Each entry point names an ``EngineSpec`` whose ``build``
makes the engine, so an engine is imported only when chosen and a machine without vllm or torch
never imports them.

``auto`` takes the first engine, in the order the specs declare (``EngineSpec.auto``), whose spec
says it can run here (``runs_here``): vLLM where vllm imports and torch sees a CUDA device, else
Tesseract. The reason is returned so the daemon can say it loudly. ``auto`` asks no engine by its
name: each spec says what ``auto`` needs to know of it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from typing import Any

import ocrwatch.config.engines as config_engines
import ocrwatch.config.env as config_env
from ocrwatch.config import Config, EngineConfig, LogConfig
from ocrwatch.engines.base import Engine, EngineSpec, Images
from ocrwatch.engines.deepseek import rungs
from ocrwatch.errors import ConfigError


def auto_order() -> list[EngineSpec]:
    """The engines ``[engine] kind = "auto"`` tries, in its order (``EngineSpec.auto``): those whose
    spec takes part, of every engine whose spec loads."""
    found: list[tuple[int, EngineSpec]] = []
    for name in config_engines.names():
        try:
            spec = config_engines.spec(name)
        except config_engines.NotFound:  # a broken engine is said when it is named
            continue
        if isinstance(spec, EngineSpec) and spec.auto is not None:
            found.append((spec.auto, spec))
    return [spec for _, spec in sorted(found, key=lambda each: each[0])]


def choose(cfg: EngineConfig, chosen_by: str | None = None) -> tuple[str, str]:
    """The engine kind to build and the human reason for it: for a kind named, ``chosen_by`` (what
    named it, as ``chosen_by`` says), else the configuration's key; for ``auto``, the first engine
    in its order that can run here, with why those before it cannot."""
    if cfg.kind != "auto":
        return cfg.kind, chosen_by or f"[engine] kind = {cfg.kind!r} in the configuration"
    passed: list[str] = []
    for spec in auto_order():
        runs, why = spec.runs_here()
        if runs:
            why = why or f"{spec.name} runs here"
            said = f"{'; '.join(passed)}, so {why}" if passed else why
            return spec.name, f"[engine] kind = 'auto': {said}"
        passed.append(why)
    raise ConfigError(
        f"engine.kind: 'auto' finds no engine that can run here ({'; '.join(passed)})",
        hint="set [engine] kind to an installed engine",
    )


def fell_back(cfg: EngineConfig, kind: str) -> bool:
    """Whether ``auto`` chose ``kind`` although an engine it tries first is installed (it could not
    run here: vllm did not import, or saw no GPU): whoever installed it wants that engine, and is
    warned. Without it, the next engine is what ``auto`` means, and nothing is wrong."""
    if cfg.kind != "auto":
        return False
    for spec in auto_order():
        if spec.name == kind:
            return False
        if spec.installed():
            return True
    return False


def chosen_by(cfg: Config) -> str:
    """What set ``[engine] kind``, as the user did: a flag of ``ocrwatch ocr`` (``--engine vllm``;
    ``--lang`` selects Tesseract), the variable, else the file's key: what a message about the
    engine names, never the file for a choice made elsewhere."""
    key, kind = cfg.key(("engine", "kind")), cfg.engine.kind
    if key == "--lang":
        return f"--lang {cfg.engine.tesseract.lang} on the command line (Tesseract's languages)"
    if key.startswith("--"):
        return f"{key} {kind} on the command line"
    if key.startswith(config_env.PREFIX):
        return f"{key}={kind} in the environment"
    return f"[engine] kind = {kind!r} in {cfg.source_file or 'the configuration'}"


def find(kind: str) -> EngineSpec:
    """The ``EngineSpec`` that ``kind`` names: its entry point, else the built-in one."""
    try:
        loaded = config_engines.spec(kind)
    except config_engines.NotFound as exc:
        raise ConfigError(
            f"engine.kind: {exc}",
            hint="install the package that provides it, or reinstall ocrwatch (pip install -e .)"
            " if none is",
        ) from None
    if not isinstance(loaded, EngineSpec):
        where = config_engines.value(kind)
        raise ConfigError(
            f"engine.kind: entry point {kind!r} ({where}) does not name an EngineSpec"
        )
    return loaded


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
        raise ConfigError(
            f"engine.plugin: {spec!r} did not build an engine (missing parts of the Engine "
            "protocol)"
        )
    return engine


def _build_plugin(cfg: EngineConfig, images: Images, log: LogConfig | None) -> Engine:
    if not cfg.plugin:
        raise ConfigError("engine.plugin: kind = 'plugin' needs plugin = 'module:attribute'")
    return load_plugin(cfg.plugin, dict(cfg.plugin_args))


PLUGIN = EngineSpec("plugin", _build_plugin, rungs=rungs.rungs, judge=rungs.judge)
"""``kind = "plugin"``: an engine named by ``[engine] plugin`` without an entry point of its own.
It has no spec to bring rungs and a judge, so it gets DeepSeek-OCR's (``[engine.vllm] ladder``):
such an engine usually wraps a generative model, which loops as DeepSeek's does; one that does not
registers an ``EngineSpec`` of its own."""


def gpu_count(proc: str = "/proc/driver/nvidia/gpus", dev: str = "/dev") -> int:
    """GPUs the NVIDIA driver lists, read without importing torch (which would stall the event
    loop).

    A container often has the device nodes (``/dev/nvidia0`` …) but not the driver's ``/proc``
    folder, so the nodes count too."""
    counts = []
    with contextlib.suppress(OSError):
        counts.append(len(os.listdir(proc)))
    with contextlib.suppress(OSError):
        counts.append(sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name)))
    return max(counts, default=0)


def build(
    cfg: EngineConfig,
    output_images: Images = "placeholder",
    *,
    kind: str | None = None,
    log: LogConfig | None = None,
) -> Engine:
    """The engine of ``kind`` (default: ``choose(cfg)``), built but not started; ``log`` is passed
    to engines that run in processes of their own."""
    return find(kind or choose(cfg)[0]).build(cfg, output_images, log)
