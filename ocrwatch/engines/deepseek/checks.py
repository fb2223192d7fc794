"""What the vLLM engine needs, checked for ``ocrwatch check`` and the start: vLLM importable and a
GPU visible (``check`` only), and a model folder it can read."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ocrwatch.config import Config
from ocrwatch.engines.base import Check, Wanted
from ocrwatch.engines.deepseek.geometry import VISIONS


def checks(cfg: Config, probe: bool, wanted: Wanted | None = None) -> Iterator[Check]:
    """The model always; with ``probe``, vLLM and the GPU first. It reads every language itself."""
    if probe:
        yield from _runs()
    yield from _model(cfg.engine.vllm.model)


def _runs() -> Iterator[Check]:
    """vLLM imports, and torch sees a CUDA device."""
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:
        yield Check(
            False,
            "vllm",
            f"does not import: {type(exc).__name__}: {exc}",
            "pip install 'ocrwatch[vllm]' on a host with an NVIDIA GPU,"
            " or set [engine] kind = 'tesseract'",
        )
        return
    yield Check(True, "vllm", f"{getattr(vllm, '__version__', '(version unknown)')} imports")
    try:
        torch = importlib.import_module("torch")
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        yield Check(
            False,
            "GPU",
            f"torch cannot look for CUDA devices: {exc}",
            "check the CUDA installation",
        )
        return
    if devices:
        yield Check(True, "GPU", f"{devices} CUDA device(s) visible")
    else:
        yield Check(
            False,
            "GPU",
            "no CUDA device is visible",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES, or set [engine] kind = 'tesseract'",
        )


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
