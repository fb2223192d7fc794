"""The vLLM engine without a GPU: engine and sampling arguments, page geometry, error mapping, the
request flow over a stand-in for ``AsyncLLM``, and replicas as the registry builds them. Where vllm
is installed, the arguments are checked against its classes."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib.util
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from ocrwatch.config import EngineConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import Engine, PageRequest
from ocrwatch.engines.deepseek import arguments, geometry, plugin, rungs, spec
from ocrwatch.engines.deepseek import engine as engine_module
from ocrwatch.engines.deepseek.engine import VllmEngine
from ocrwatch.engines.deepseek.geometry import OCR1, OCR2
from ocrwatch.engines.deepseek.options import SamplingRung, VllmConfig
from ocrwatch.engines.deepseek.platform import Platform
from ocrwatch.engines.replicas import EngineSet
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import ConfigError, EngineDead, EngineFailed

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm not installed"
)

A4_300DPI = (2480, 3508)
LETTER_300DPI = (2550, 3300)


def fit(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """What the renderer makes of a page whose long side exceeds the cap."""
    scale = min(1.0, max_side / max(size))
    return round(size[0] * scale), round(size[1] * scale)


# --- geometry -------------------------------------------------------------------------------------


def test_ocr2_renders_a4_and_letter_onto_the_2x3_tile_grid_without_upscaling() -> None:
    hint = OCR2.page_geometry()
    assert hint.max_side == 2304 and hint.dpi == 210 and hint.max_pixels is None
    for page in (A4_300DPI, LETTER_300DPI):
        width, height = fit(page, hint.max_side)
        assert height == 2304
        assert OCR2.tile_grid(width, height) == (2, 3)
        assert width >= 2 * 768 and height >= 3 * 768
    assert OCR2.tile_grid(*fit(A4_300DPI[::-1], hint.max_side)) == (3, 2)
    assert round(297 / 25.4 * hint.dpi) >= hint.max_side and round(11 * hint.dpi) >= hint.max_side


def test_ocr1_uses_640_tiles_so_its_cap_is_1920() -> None:
    hint = OCR1.page_geometry()
    assert hint.max_side == 1920 and hint.dpi == 175
    assert OCR1.tile_grid(*fit(A4_300DPI, hint.max_side)) == (2, 3)


def test_small_images_get_the_global_view_only() -> None:
    assert OCR2.tile_grid(700, 500) == (1, 1)
    assert OCR2.tile_grid(1600, 800) == (2, 1)


def test_tile_grid_matches_vllm_where_its_processor_imports() -> None:
    processors = pytest.importorskip("vllm.transformers_utils.processors.deepseek_ocr")
    for size in [(1629, 2304), (2304, 1629), (1000, 1000), (800, 4000), (3000, 900), (769, 768)]:
        expected = processors.count_tiles(*size, image_size=768)
        assert OCR2.tile_grid(*size) == tuple(expected), size


def test_architecture_from_a_local_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekOCRForCausalLM"]}))
    assert geometry.model_architecture(str(tmp_path)) == OCR1.architecture
    engine = VllmEngine(VllmConfig(model=str(tmp_path)))
    assert engine.geometry.max_side == 1920


@pytest.mark.parametrize(
    ("model", "architecture"),
    [
        ("deepseek-ai/DeepSeek-OCR-2", OCR2.architecture),
        ("deepseek-ai/DeepSeek-OCR", OCR1.architecture),
        ("/models/deepseek_ocr2-bf16", OCR2.architecture),
        ("/models/DeepSeek-OCR", OCR1.architecture),
        ("/models/unknown", OCR2.architecture),
    ],
)
def test_architecture_from_the_name(model: str, architecture: str) -> None:
    assert geometry.model_architecture(model) == architecture


def test_unreadable_config_json_falls_back_to_the_name(tmp_path: Path) -> None:
    model = tmp_path / "DeepSeek-OCR"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    assert geometry.model_architecture(str(model)) == OCR1.architecture


# --- engine arguments -----------------------------------------------------------------------------


def test_engine_kwargs_follow_the_deepseek_ocr_recipe() -> None:
    kwargs = arguments.engine_kwargs(VllmConfig(ngram_processor="batched"))
    assert kwargs["model"] == "deepseek-ai/DeepSeek-OCR-2"
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["mm_processor_cache_gb"] == 0
    assert kwargs["logits_processors"] == [
        "ocrwatch.engines.deepseek.ngram_vllm:BatchedNoRepeatNGram"
    ]
    # GPU memory unknown
    assert kwargs["max_num_seqs"] == 128 and kwargs["max_num_batched_tokens"] == 16384
    gpu = arguments.engine_kwargs(VllmConfig(ngram_processor="gpu"))
    assert "logits_processors" not in gpu  # the guard runs inside vLLM's V2 sampler (ngram_gpu)
    fallback = arguments.engine_kwargs(VllmConfig(ngram_processor="gpu"), processor="batched")
    assert fallback["logits_processors"] == kwargs["logits_processors"]
    per_request = arguments.engine_kwargs(VllmConfig(ngram_processor="per_request"))
    assert per_request["logits_processors"] == [
        "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
    ]
    unguarded = VllmConfig(ngram_size=0, ladder=(SamplingRung(temperature=0.2, ngram_size=0),))
    assert "logits_processors" not in arguments.engine_kwargs(unguarded)
    rung_only = VllmConfig(
        ngram_size=0,
        ladder=(SamplingRung(temperature=0.2, ngram_size=12),),
        ngram_processor="batched",
    )
    assert "logits_processors" in arguments.engine_kwargs(rung_only)
    assert kwargs["scheduling_policy"] == "priority"
    assert kwargs["limit_mm_per_prompt"] == {"image": 1}
    assert kwargs["renderer_num_workers"] >= 1
    assert "trust_remote_code" not in kwargs
    for absent in ("revision", "tokenizer", "block_size"):
        assert absent not in kwargs


def test_engine_kwargs_carry_the_config_and_engine_args_win() -> None:
    cfg = VllmConfig(
        model="/models/dsocr2",
        revision="abc123",
        max_num_batched_tokens=16384,
        block_size=32,
        tensor_parallel_size=2,
        data_parallel_size=4,
        seed=7,
        load_format="dummy",
        enforce_eager=True,
        engine_args={
            "gpu_memory_utilization": 0.5,
            "enable_prefix_caching": True,
            "kv_cache_dtype": "fp8",
        },
    )
    kwargs = arguments.engine_kwargs(cfg)
    assert (
        kwargs["revision"] == "abc123"
        and kwargs["max_num_batched_tokens"] == 16384
        and kwargs["block_size"] == 32
    )
    assert (kwargs["tensor_parallel_size"], kwargs["data_parallel_size"], kwargs["seed"]) == (
        2,
        4,
        7,
    )
    assert kwargs["load_format"] == "dummy" and kwargs["enforce_eager"] is True
    assert kwargs["gpu_memory_utilization"] == 0.5 and kwargs["enable_prefix_caching"] is True
    assert kwargs["kv_cache_dtype"] == "fp8"


def test_a_processor_cache_turns_parallel_input_preparation_off() -> None:
    kwargs = arguments.engine_kwargs(VllmConfig(engine_args={"mm_processor_cache_gb": 4}))
    assert kwargs["renderer_num_workers"] == 1
    kwargs = arguments.engine_kwargs(
        VllmConfig(engine_args={"mm_processor_cache_gb": 4, "renderer_num_workers": 3})
    )
    assert kwargs["renderer_num_workers"] == 3


def test_engine_env_spawns_and_keeps_what_the_user_set(tmp_path: Path) -> None:
    env = arguments.engine_env(VllmConfig(ngram_processor="batched"), {})
    assert env == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_NO_USAGE_STATS": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_TUNED_CONFIG_FOLDER": str(arguments.MOE_CONFIGS),
        "OCRWATCH_FAST_ENCODER": "1",
        "OCRWATCH_ENCODER_GRAPHS": "0",
        "OCRWATCH_NGRAM_GPU": "0",
        "OCRWATCH_LANES": "0",
    }
    assert arguments.engine_env(VllmConfig(ngram_processor="gpu"), {})["OCRWATCH_NGRAM_GPU"] == "1"
    cfg = VllmConfig(
        ngram_processor="batched",
        compile_cache_dir=tmp_path,
        encoder_cuda_graphs=True,
        priority_lanes=True,
    )
    user = {
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
        "OCRWATCH_FAST_ENCODER": "0",
        "OMP_NUM_THREADS": "8",
        "VLLM_TUNED_CONFIG_FOLDER": str(tmp_path),
    }
    env = arguments.engine_env(cfg, user)
    assert env == {
        "VLLM_NO_USAGE_STATS": "1",
        "OCRWATCH_FAST_ENCODER": "1",
        "OCRWATCH_ENCODER_GRAPHS": "1",
        "OCRWATCH_NGRAM_GPU": "0",
        "OCRWATCH_LANES": "1",
        "VLLM_CACHE_ROOT": str(tmp_path),
    }
    off = VllmConfig(fast_encoder=False, encoder_cuda_graphs=True)
    assert arguments.engine_env(off, {})["OCRWATCH_ENCODER_GRAPHS"] == "0"
    assert arguments.engine_env(off, {})["OCRWATCH_FAST_ENCODER"] == "0"
    unguarded = VllmConfig(ngram_size=0, ladder=(), ngram_processor="gpu")
    assert arguments.engine_env(unguarded, {})["OCRWATCH_NGRAM_GPU"] == "0"


def test_the_shipped_moe_tiles_are_in_vllms_format() -> None:
    """vLLM reads ``E=..,N=..,device_name=...json`` from ``VLLM_TUNED_CONFIG_FOLDER``: token counts
    as keys, each with the Triton kernel's tile parameters; a file it cannot parse would fail every
    MoE layer."""
    files = sorted(arguments.MOE_CONFIGS.glob("*.json"))
    assert [f.name for f in files] == ["E=64,N=896,device_name=NVIDIA_H200.json"]
    tiles = json.loads(files[0].read_text())
    assert 256 in {int(m) for m in tiles} and 1 in {int(m) for m in tiles}
    keys = {
        "BLOCK_SIZE_M",
        "BLOCK_SIZE_N",
        "BLOCK_SIZE_K",
        "GROUP_SIZE_M",
        "num_warps",
        "num_stages",
    }
    for config in tiles.values():
        assert set(config) == keys and all(isinstance(v, int) and v > 0 for v in config.values())


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("yes", True), ("0", False), ("off", False), (" ", False)]
)
def test_the_plugin_switches_read_their_own_variable(value: str, on: bool) -> None:
    env = {plugin.GRAPHS_ENV: value}
    assert plugin.enabled(env, name=plugin.GRAPHS_ENV) is on
    assert plugin.enabled(env) is False  # the fast-encoder switch is another variable


def test_engine_args_this_vllm_lacks_are_a_config_error() -> None:
    arguments.check_engine_args({"model": "m", "seed": 0}, {"model", "seed", "dtype"}, "0.33.0")
    with pytest.raises(
        ConfigError, match="vLLM 0.33.0 has no engine argument 'calculate_kv_scales'"
    ):
        arguments.check_engine_args(
            {"model": "m", "calculate_kv_scales": True}, {"model"}, "0.33.0"
        )


# --- sampling -------------------------------------------------------------------------------------


def test_sampling_kwargs_for_the_greedy_rung() -> None:
    cfg = VllmConfig()
    kwargs = arguments.sampling_kwargs(cfg, rungs.rungs(EngineConfig())[0])
    assert kwargs == {
        "temperature": 0.0,
        "max_tokens": 4096,
        "skip_special_tokens": False,
        "ignore_eos": False,
        "extra_args": {
            "ngram_size": 30,
            "window_size": 90,
            "whitelist_token_ids": [128821, 128822],
        },
    }


def test_sampling_kwargs_for_a_warmer_rung_seed_it() -> None:
    kwargs = arguments.sampling_kwargs(
        VllmConfig(seed=3), Sampling(temperature=0.2, ngram_size=12, window_size=120)
    )
    assert kwargs["temperature"] == 0.2 and kwargs["seed"] == 3
    assert kwargs["max_tokens"] == 4096
    assert kwargs["extra_args"]["ngram_size"] == 12 and kwargs["extra_args"]["window_size"] == 120


@pytest.mark.parametrize("sampling", [Sampling(ngram_size=0), Sampling(window_size=0)])
def test_a_zero_ngram_setting_turns_the_ngram_processor_off(sampling: Sampling) -> None:
    assert "extra_args" not in arguments.sampling_kwargs(VllmConfig(), sampling)


def test_sampling_kwargs_pass_ignore_eos_and_a_rung_max_tokens() -> None:
    kwargs = arguments.sampling_kwargs(VllmConfig(ignore_eos=True), Sampling(max_tokens=1))
    assert kwargs["ignore_eos"] is True and kwargs["max_tokens"] == 1


@needs_vllm
def test_engine_kwargs_construct_vllm_engine_args() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = arguments.engine_kwargs(VllmConfig(load_format="dummy", seed=1))
    known = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    arguments.check_engine_args(kwargs, known, "installed")
    args = AsyncEngineArgs(**kwargs)
    assert args.scheduling_policy == "priority" and args.enable_prefix_caching is False
    assert args.mm_processor_cache_gb == 0 and args.limit_mm_per_prompt == {"image": 1}


@needs_vllm
def test_sampling_kwargs_construct_vllm_sampling_params_the_ngram_processor_accepts() -> None:
    from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    cfg = VllmConfig()
    for rung in rungs.rungs(EngineConfig(vllm=cfg)):
        params = SamplingParams(
            **arguments.sampling_kwargs(cfg, rung), output_kind=RequestOutputKind.FINAL_ONLY
        )
        NGramPerReqLogitsProcessor.validate_params(params)
        assert params.skip_special_tokens is False and params.temperature == rung.temperature


# --- small pure helpers ---------------------------------------------------------------------------


def test_priority_passes_unchanged_because_both_sides_run_the_lowest_first() -> None:
    assert [arguments.vllm_priority(p) for p in (0, 5, 10_050_000_000)] == [
        0,
        5,
        10_050_000_000,
    ]


def test_a_prompt_without_an_image_tag_gets_one() -> None:
    assert arguments.model_prompt("<image>\nFree OCR.") == "<image>\nFree OCR."
    assert arguments.model_prompt("Describe the chart.") == "<image>\nDescribe the chart."


def test_request_timings_from_vllm_metrics() -> None:
    metrics = SimpleNamespace(
        queued_ts=10.0,
        scheduled_ts=10.5,
        first_token_ts=11.0,
        last_token_ts=13.0,
        first_token_latency=1.2,
    )
    assert engine_module.request_timings(metrics) == {
        "queue": 0.5,
        "first_token": 1.2,
        "decode": 2.0,
    }
    assert engine_module.request_timings(None) == {}
    assert engine_module.request_timings(SimpleNamespace(queued_ts=0.0, scheduled_ts=0.0)) == {}


class FakeDeadError(Exception):
    """Stands in for vLLM's EngineDeadError."""


def test_engine_error_mapping() -> None:
    dead = (FakeDeadError,)
    assert isinstance(engine_module.engine_error(FakeDeadError(), dead, errored=False), EngineDead)
    assert isinstance(
        engine_module.engine_error(
            RuntimeError("CUDA error: an illegal memory access"), dead, errored=False
        ),
        EngineDead,
    )
    wrapped = RuntimeError("generate failed")
    wrapped.__cause__ = FakeDeadError("core gone")
    assert isinstance(engine_module.engine_error(wrapped, dead, errored=False), EngineDead)
    assert isinstance(
        engine_module.engine_error(ValueError("prompt too long"), dead, errored=True), EngineDead
    )
    failed = engine_module.engine_error(ValueError("prompt too long"), dead, errored=False)
    assert isinstance(failed, EngineFailed) and "prompt too long" in failed.message


# --- the request flow over a stand-in AsyncLLM ----------------------------------------------------

GROUNDED = (
    "<|ref|>title<|/ref|><|det|>[[100, 50, 900, 120]]<|/det|>\n# Report\n\n"
    "<|ref|>text<|/ref|><|det|>[[100, 200, 900, 400]]<|/det|>\nBody text.\n\n"
    "<|ref|>image<|/ref|><|det|>[[100, 500, 900, 900]]<|/det|><｜end▁of▁sentence｜>"
)


def output(text: str = GROUNDED, finish_reason: str = "stop") -> SimpleNamespace:
    metrics = SimpleNamespace(
        queued_ts=1.0,
        scheduled_ts=1.25,
        first_token_ts=2.0,
        last_token_ts=3.0,
        first_token_latency=0.9,
    )
    completion = SimpleNamespace(text=text, token_ids=list(range(12)), finish_reason=finish_reason)
    return SimpleNamespace(
        outputs=[completion], prompt_token_ids=list(range(1130)), metrics=metrics, finished=True
    )


class FakeLLM:
    """The slice of ``AsyncLLM`` the engine uses: ``generate``, ``errored``, ``shutdown``."""

    def __init__(self, result: Any = None, hold: bool = False) -> None:
        self.result = result if result is not None else output()
        self.hold = hold
        self.calls: list[dict[str, Any]] = []
        self.errored = False
        self.shut_down = False
        self.generating = asyncio.Event()

    async def generate(
        self, engine_input: Any, params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]:
        self.calls.append(
            {
                "input": engine_input,
                "params": params,
                "request_id": request_id,
                "priority": priority,
            }
        )
        self.generating.set()
        if self.hold:
            await asyncio.Event().wait()
        if isinstance(self.result, BaseException):
            raise self.result
        yield self.result

    def shutdown(self) -> None:
        self.shut_down = True


class FakeRuntime:
    """The slice of ``_Runtime`` the engine uses; ``llm`` is what ``engine()`` builds."""

    version = "0.0-test"
    dead_errors = (FakeDeadError,)
    llm: FakeLLM | None = None

    def __init__(self) -> None:
        self.prepared: list[tuple[str, str]] = []
        self.engine_kwargs: dict[str, Any] = {}

    def engine(self, kwargs: dict[str, Any], fallback: dict[str, Any] | None = None) -> FakeLLM:
        self.engine_kwargs, self.fallback = kwargs, fallback
        assert self.llm is not None
        return self.llm

    def platform(self) -> Platform:
        return Platform("cuda", 143771 * 2**20, 1)  # an H200

    def sampling_params(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    async def prepare(self, llm: Any, prompt: str, image: Image.Image) -> dict[str, Any]:
        self.prepared.append((prompt, image.mode))
        return {"type": "multimodal", "prompt": prompt}


def running_engine(llm: FakeLLM) -> tuple[VllmEngine, FakeRuntime]:
    engine = VllmEngine(VllmConfig())
    runtime = FakeRuntime()
    engine._runtime = runtime  # type: ignore[assignment]
    engine._llm = llm
    return engine, runtime


def request(request_id: str = "doc/p0/a0", priority: int = 42) -> PageRequest:
    return PageRequest(
        request_id=request_id,
        image=Image.new("L", (1000, 1414), 255),
        prompt="Convert the document to markdown.",
        priority=priority,
        sampling=Sampling(temperature=0.1, ngram_size=20, window_size=90),
        page_index=2,
    )


def test_recognize_submits_one_page_and_returns_parsed_output() -> None:
    llm = FakeLLM()
    engine, runtime = running_engine(llm)
    rec = asyncio.run(engine.recognize(request()))
    (call,) = llm.calls
    assert call["request_id"] == "doc/p0/a0" and call["priority"] == 42
    assert call["params"]["temperature"] == 0.1 and call["params"]["extra_args"]["ngram_size"] == 20
    assert runtime.prepared == [("<image>\nConvert the document to markdown.", "RGB")]
    assert rec.raw == GROUNDED
    assert rec.markdown == "# Report\n\nBody text.\n\n![](page-3-figure-1)"
    assert [block["type"] for block in rec.blocks] == ["title", "text", "image"]
    assert rec.blocks[0]["bbox"] == [100, 70, 900, 169]
    assert (rec.prompt_tokens, rec.completion_tokens, rec.finish_reason) == (1130, 12, "stop")
    assert {"prepare", "total", "queue", "first_token", "decode"} <= set(rec.timings)
    assert rec.seconds == rec.timings["total"]


def test_abort_cancels_the_request_and_its_attempts() -> None:
    llm = FakeLLM(hold=True)
    engine, _ = running_engine(llm)

    async def scenario() -> None:
        task = asyncio.create_task(engine.recognize(request("doc/p3/a1")))
        await llm.generating.wait()
        await engine.abort("doc/p3/a0")
        await engine.abort("unknown")
        assert not task.done()
        await engine.abort("doc/p3")
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert engine._inflight == {}


def test_a_request_vllm_aborted_raises_cancelled() -> None:
    engine, _ = running_engine(FakeLLM(output(finish_reason="abort")))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(engine.recognize(request()))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FakeDeadError(), EngineDead),
        (RuntimeError("CUDA error: out of memory"), EngineDead),
        (ValueError("The decoder prompt is longer than the maximum model length"), EngineFailed),
    ],
)
def test_engine_exceptions_become_ocrwatch_errors(
    error: Exception, expected: type[Exception]
) -> None:
    engine, _ = running_engine(FakeLLM(error))
    with pytest.raises(expected):
        asyncio.run(engine.recognize(request()))


def test_recognize_before_start_is_engine_dead() -> None:
    with pytest.raises(EngineDead):
        asyncio.run(VllmEngine(VllmConfig()).recognize(request()))


def test_close_cancels_pages_in_flight_and_shuts_vllm_down() -> None:
    llm = FakeLLM(hold=True)
    engine, _ = running_engine(llm)

    async def scenario() -> asyncio.Task[Any]:
        task = asyncio.create_task(engine.recognize(request()))
        await llm.generating.wait()
        await engine.close()
        return task

    task = asyncio.run(scenario())
    assert task.cancelled() and llm.shut_down and engine._llm is None


def test_engine_contract_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(registry, "gpu_count", lambda: 6)
    cfg = VllmConfig(max_num_seqs=64, data_parallel_size=2, replicas=3, replica_processes=False)
    engine = registry.build(EngineConfig(vllm=cfg), kind="vllm")
    assert isinstance(engine, Engine)
    assert engine.max_concurrency == 64 * 2 * 3
    assert engine.geometry.max_side == 2304
    engine.release()
    described = engine.describe()
    assert described["name"] == "vllm" and described["architecture"] == "DeepseekOCR2ForCausalLM"
    assert described["sampling"]["temperature"] == 0.0 and len(described["ladder"]) == 2
    assert described["replicas"] == 3 and "processes" not in described
    json.dumps(described)


@pytest.fixture(autouse=True)
def unfrozen_heap() -> Iterator[None]:
    """A started engine freezes the process's heap; the next test starts from a heap the collector
    sees."""
    yield
    gc.unfreeze()


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in arguments.engine_env(VllmConfig(), {}).items():
        monkeypatch.setenv(name, value)


def test_start_builds_the_engine_and_sends_one_warmup_page(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    llm = FakeLLM(output("Free", "length"))
    monkeypatch.setattr(FakeRuntime, "llm", llm)
    monkeypatch.setattr(engine_module, "_Runtime", FakeRuntime)
    engine = VllmEngine(VllmConfig(load_format="dummy", ngram_processor="batched"))
    asyncio.run(engine.start())
    runtime = engine._runtime
    assert isinstance(runtime, FakeRuntime) and runtime.engine_kwargs["load_format"] == "dummy"
    # sized for the GPU it found
    assert runtime.engine_kwargs["max_num_seqs"] == 256 == engine.max_concurrency
    assert runtime.engine_kwargs["max_num_batched_tokens"] == 32768
    assert runtime.fallback is None


def test_the_gpu_guard_falls_back_to_the_host_processor_where_vllm_runs_its_v1_runner(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    llm = FakeLLM(output("Free", "length"))
    monkeypatch.setattr(FakeRuntime, "llm", llm)
    monkeypatch.setattr(engine_module, "_Runtime", FakeRuntime)
    engine = VllmEngine(VllmConfig(ngram_processor="gpu"))
    asyncio.run(engine.start())
    runtime = engine._runtime
    assert isinstance(runtime, FakeRuntime) and "logits_processors" not in runtime.engine_kwargs
    assert runtime.fallback is not None
    assert runtime.fallback["logits_processors"] == [arguments.NGRAM_PROCESSORS["batched"]]
    (call,) = llm.calls
    assert call["request_id"] == "ocrwatch-warmup"
    assert call["params"]["max_tokens"] == 1 and "extra_args" not in call["params"]
    assert runtime.prepared == [("<image>\nFree OCR.", "RGB")]
    assert engine.describe()["vllm"] == "0.0-test"


def test_a_failed_warmup_shuts_the_engine_down_and_is_engine_dead(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    llm = FakeLLM(ValueError("bad processor"))
    monkeypatch.setattr(FakeRuntime, "llm", llm)
    monkeypatch.setattr(engine_module, "_Runtime", FakeRuntime)
    engine = VllmEngine(VllmConfig())
    with pytest.raises(EngineDead, match="warm-up"):
        asyncio.run(engine.start())
    assert llm.shut_down and engine._llm is None


def test_a_missing_vllm_at_start_is_engine_dead_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    def no_vllm() -> None:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

    monkeypatch.setattr(engine_module, "_Runtime", no_vllm)
    with pytest.raises(EngineDead, match="could not start") as caught:
        asyncio.run(VllmEngine(VllmConfig()).start())
    assert "vLLM install" in caught.value.hint


def test_an_engine_argument_vllm_lacks_stops_start_as_a_config_error(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    class OldRuntime(FakeRuntime):
        def engine(self, kwargs: dict[str, Any], fallback: dict[str, Any] | None = None) -> FakeLLM:
            arguments.check_engine_args(kwargs, {"model"}, self.version)
            return FakeLLM()

    monkeypatch.setattr(engine_module, "_Runtime", OldRuntime)
    with pytest.raises(ConfigError, match="has no engine argument"):
        asyncio.run(VllmEngine(VllmConfig()).start())


@pytest.mark.parametrize(
    ("settings", "visible", "count", "expected"),
    [
        ({}, None, 8, [None]),
        ({"replicas": 2}, None, 2, ["0", "1"]),
        ({"replicas": 2}, "3,5", 8, ["3", "5"]),
        ({"replicas": 2, "tensor_parallel_size": 2}, None, 4, ["0,1", "2,3"]),
        (
            {"replicas": 2, "data_parallel_size": 2},
            "GPU-a, GPU-b,GPU-c,GPU-d",
            4,
            ["GPU-a,GPU-b", "GPU-c,GPU-d"],
        ),
        ({"replicas": 3}, None, 4, ["0", "1", "2"]),
    ],
)
def test_each_replica_gets_its_own_gpus(
    settings: dict[str, int], visible: str | None, count: int, expected: list[str | None]
) -> None:
    assert spec.replica_devices(VllmConfig(**settings), visible, count) == expected


def test_more_replicas_than_gpus_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"engine.vllm.replicas: 2 replicas of 2 GPU\(s\) need 4 GPUs, 3 visible"
    ):
        spec.replica_devices(VllmConfig(replicas=2, tensor_parallel_size=2), "0,1,2", 8)


def test_release_after_a_document_never_runs_a_full_collection() -> None:
    """A full collection walks the front end's whole heap and ran on the event loop after every
    document."""
    engine = VllmEngine(VllmConfig())
    full, young = gc.get_stats()[2]["collections"], gc.get_stats()[1]["collections"]
    engine.release()
    assert gc.get_stats()[2]["collections"] == full
    assert gc.get_stats()[1]["collections"] > young


def test_the_start_up_heap_is_frozen_while_the_engine_runs(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    monkeypatch.setattr(FakeRuntime, "llm", FakeLLM(output("Free", "length")))
    monkeypatch.setattr(engine_module, "_Runtime", FakeRuntime)
    engine = VllmEngine(VllmConfig())

    async def scenario() -> tuple[int, int]:
        await engine.start()
        frozen = gc.get_freeze_count()
        await engine.close()
        return frozen, gc.get_freeze_count()

    frozen, after = asyncio.run(scenario())
    assert frozen > 1000 and after == 0


def test_pinning_a_replica_restores_the_users_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with arguments.visible_devices("3"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


class ReplicaRuntime(FakeRuntime):
    """Builds one held ``FakeLLM`` per replica and records the GPUs each engine core would have
    seen."""

    built: list[tuple[str | None, FakeLLM]] = []

    def engine(self, kwargs: dict[str, Any], fallback: dict[str, Any] | None = None) -> FakeLLM:
        llm = FakeLLM(output("Free", "length"))
        self.built.append((os.environ.get("CUDA_VISIBLE_DEVICES"), llm))
        return llm


def test_replicas_start_pinned_warm_up_each_and_share_the_pages(
    monkeypatch: pytest.MonkeyPatch, vllm_env: None
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(ReplicaRuntime, "built", [])
    monkeypatch.setattr(engine_module, "_Runtime", ReplicaRuntime)
    monkeypatch.setattr(registry, "gpu_count", lambda: 2)
    engine = registry.build(
        EngineConfig(vllm=VllmConfig(replicas=2, replica_processes=False)), kind="vllm"
    )
    assert isinstance(engine, EngineSet) and all(
        isinstance(member, VllmEngine) for member in engine.engines
    )

    async def scenario() -> None:
        await engine.start()
        assert "CUDA_VISIBLE_DEVICES" not in os.environ  # restored after each build
        (_, first), (_, second) = ReplicaRuntime.built
        assert (
            [c["request_id"] for c in first.calls]
            == [c["request_id"] for c in second.calls]
            == ["ocrwatch-warmup"]
        )
        for llm in (first, second):
            llm.hold, llm.generating = True, asyncio.Event()
        tasks = [asyncio.create_task(engine.recognize(request(f"doc/p{n}/a0"))) for n in range(5)]
        await asyncio.wait_for(asyncio.gather(first.generating.wait(), second.generating.wait()), 5)
        await asyncio.sleep(0.05)
        assert sorted([len(first.calls) - 1, len(second.calls) - 1]) == [2, 3]  # least loaded first
        await engine.abort("doc/p0")
        await asyncio.wait(tasks[:1], timeout=5)
        assert tasks[0].cancelled()
        assert sum(engine._load) == 4
        await engine.close()
        assert all(t.cancelled() for t in tasks) and first.shut_down and second.shut_down

    asyncio.run(scenario())
    assert [devices for devices, _ in ReplicaRuntime.built] == ["0", "1"]


def test_a_one_gpu_engine_asks_for_vllms_v2_runner_unless_a_logits_processor_needs_v1() -> None:
    """The shipped default (the n-gram guard as a kernel in the V2 sampler) on the V2 runner,
    measured faster and equal in its greedy ids; a host logits processor, which the V2 runner
    refuses, or several GPUs keep vLLM's choice, and the user's environment wins."""
    gpu = Platform("cuda", 80 * 2**30, 1)
    assert VllmConfig().ngram_processor == "gpu"
    assert arguments.platform_env(VllmConfig(), gpu, {})["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    stop = VllmConfig(guard="stop")
    assert arguments.platform_env(stop, gpu, {})["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    unguarded = VllmConfig(ngram_size=0, ladder=(), ngram_processor="batched")
    assert arguments.platform_env(unguarded, gpu, {})["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    for v1 in (
        VllmConfig(ngram_processor="batched"),
        VllmConfig(ngram_processor="per_request"),
        VllmConfig(tensor_parallel_size=2),
        VllmConfig(data_parallel_size=2),
    ):
        assert "VLLM_USE_V2_MODEL_RUNNER" not in arguments.platform_env(v1, gpu, {})
    assert "VLLM_USE_V2_MODEL_RUNNER" not in arguments.platform_env(
        VllmConfig(), gpu, {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    )
