"""The engine's supervision: which engine runs, said as a warning only where the user asked for
another (an installed vLLM that cannot run), since Tesseract on a host without vLLM is normal."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from structlog.testing import capture_logs

from ocrwatch.config import Config
from ocrwatch.engines import registry
from ocrwatch.engines.base import EngineSpec
from ocrwatch.infra.metrics import Metrics
from ocrwatch.recognize.supervisor import EngineSupervisor
from tests.support.engines_base import StubEngine
from tests.test_registry import fake_module, fake_torch


def selected(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The ``engine_selected`` line of a start with ``[engine] kind = "auto"``."""
    monkeypatch.setattr(
        registry, "find", lambda kind: EngineSpec(name=kind, build=lambda *_: StubEngine())
    )
    supervisor = EngineSupervisor(Config(), Metrics())

    async def start_and_close() -> None:
        await supervisor.start()
        await supervisor.close()

    with capture_logs() as logs:
        asyncio.run(start_and_close())
    [line] = [line for line in logs if line["event"] == "engine_selected"]
    return line


def test_tesseract_on_a_host_without_vllm_is_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed: it cannot be imported
    line = selected(monkeypatch)
    assert (line["engine"], line["log_level"]) == ("tesseract", "info")
    assert "vllm is not installed" in line["reason"]


def test_an_installed_vllm_that_sees_no_gpu_is_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", fake_module("vllm", __version__="0.33.0"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(0))
    line = selected(monkeypatch)
    assert (line["engine"], line["log_level"]) == ("tesseract", "warning")
    assert "no CUDA device is visible" in line["reason"]
