"""The embedded vLLM engine: an in-process ``AsyncLLM`` (vLLM v1) serving DeepSeek-OCR-2 or DeepSeek-OCR.

vLLM is imported in ``start()`` only, so this module imports on machines without it. Engine and sampling
arguments are built by pure functions (``engine_kwargs``, ``sampling_kwargs``) that follow vLLM's DeepSeek-OCR
recipe and are tested without vLLM; ``_Runtime`` is the one place that touches vLLM's API, checked against
vLLM 0.26.0 and 0.33.0.

Throughput needs many pages in flight (continuous batching does the batching) and a free event loop: each
page's multimodal input is prepared by vLLM's renderer in its worker threads (``render_cmpl_async``), never
in the loop, and the engine core runs in its own process.

``replicas`` runs that many independent engines, each on its own GPUs, and sends each page to the one with
the fewest pages in flight: unlike vLLM's data parallelism, whose ranks step in lockstep for a
mixture-of-experts decoder such as DeepSeek-OCR's, replicas never wait for each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from PIL import Image

from ocrwatch import layout
from ocrwatch.config import PROMPT_PRESETS, VllmConfig
from ocrwatch.engines import vllm_plugin
from ocrwatch.engines.base import PageRequest, Recognition, RenderHint, Sampling
from ocrwatch.errors import ConfigError, EngineDead, EngineFailed, OcrwatchError
from ocrwatch.ladder import base_sampling

log = structlog.get_logger()

Images = Literal["placeholder", "drop"]

NGRAM_PROCESSORS = {
    "batched": "ocrwatch.engines.vllm_ngram:BatchedNoRepeatNGram",
    "per_request": "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor",
}
IMAGE_TOKEN = "<image>"
WARMUP_REQUEST_ID = "ocrwatch-warmup"
LETTER_LONG_SIDE_INCHES = 11.0
RENDERER_WORKERS = 4
MOE_CONFIGS = Path(__file__).with_name("moe_configs")


@dataclass(frozen=True)
class VisionGeometry:
    """How a DeepSeek-OCR model sees a page: a square global view plus a grid of up to ``max_tiles`` tiles.

    vLLM's ``DeepseekOCRProcessor`` picks the grid (2 to ``max_tiles`` tiles) whose aspect ratio is closest
    to the page's and resizes the page onto it, so a portrait A4 or Letter page becomes a 2×3 grid whose
    long side is three tiles. Rendering with that long side as the cap gives the model every pixel it
    consumes and no more; ``dpi`` is the lowest at which both A4 and Letter reach the cap, so common pages
    are never upscaled by the processor.
    """

    architecture: str
    base_size: int
    tile_size: int
    max_tiles: int = 6
    min_tiles: int = 2

    @property
    def max_side(self) -> int:
        return 3 * self.tile_size

    def render_hint(self) -> RenderHint:
        return RenderHint(dpi=math.ceil(self.max_side / LETTER_LONG_SIDE_INCHES), max_side=self.max_side)

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) the processor cuts a ``width``×``height`` image into; (1, 1) is the global view only."""
        if width <= self.tile_size and height <= self.tile_size:
            return (1, 1)
        ratios = sorted(
            {
                (columns, rows)
                for columns in range(1, self.max_tiles + 1)
                for rows in range(1, self.max_tiles + 1)
                if self.min_tiles <= columns * rows <= self.max_tiles
            },
            key=lambda grid: grid[0] * grid[1],
        )
        aspect = width / height
        best, best_diff = (1, 1), float("inf")
        for grid in ratios:
            diff = abs(aspect - grid[0] / grid[1])
            if diff < best_diff:
                best, best_diff = grid, diff
            elif diff == best_diff and width * height > 0.5 * self.tile_size**2 * grid[0] * grid[1]:
                best = grid
        return best


OCR2 = VisionGeometry("DeepseekOCR2ForCausalLM", base_size=1024, tile_size=768)
OCR1 = VisionGeometry("DeepseekOCRForCausalLM", base_size=1024, tile_size=640)
GEOMETRIES = {geometry.architecture: geometry for geometry in (OCR2, OCR1)}


def model_architecture(model: str) -> str:
    """The model class: from a local model's ``config.json``, else from the name (``…OCR-2`` vs ``…OCR``)."""
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        try:
            architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            architectures = []
        for architecture in architectures:
            if architecture in GEOMETRIES:
                return architecture
    name = model.lower()
    if re.search(r"ocr[-_ .]?2", name) is None and "ocr" in name:
        return OCR1.architecture
    return OCR2.architecture


def geometry(cfg: VllmConfig) -> VisionGeometry:
    return GEOMETRIES[model_architecture(cfg.model)]


def engine_env(cfg: VllmConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment for vLLM, given the current one: spawn (the daemon is multi-threaded, so forking the
    engine core is unsafe), one OpenMP thread per torch call and no usage reporting unless the user chose
    otherwise; the fast encoder's switches, which ``vllm_plugin`` and the fast class read in every vLLM
    process; the compile cache where the config puts it.

    One OpenMP thread: vLLM does so for its multi-GPU workers but not for a one-GPU engine core, and the
    daemon's input-preparation threads each ran torch ops over every core at once. On the 32-core H200 host
    that made input preparation 460 ms a page and capped the daemon at 5.4 pages/s (bench/README.md, run 4).

    ``VLLM_TUNED_CONFIG_FOLDER``: the fused-MoE tiles tuned for DeepSeek-OCR's experts (``MOE_CONFIGS``);
    vLLM has none for that shape and falls back to generic tiles."""
    defaults = {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_NO_USAGE_STATS": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_TUNED_CONFIG_FOLDER": str(MOE_CONFIGS),
    }
    env = {key: value for key, value in defaults.items() if key not in environ}
    env[vllm_plugin.ENV] = "1" if cfg.fast_encoder else "0"
    env[vllm_plugin.GRAPHS_ENV] = "1" if cfg.fast_encoder and cfg.encoder_cuda_graphs else "0"
    if cfg.compile_cache_dir is not None:
        env["VLLM_CACHE_ROOT"] = str(cfg.compile_cache_dir.expanduser())
    return env


def engine_kwargs(cfg: VllmConfig) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments: vLLM's DeepSeek-OCR recipe, then ``[engine.vllm.engine_args]``."""
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": cfg.max_num_seqs,
        "enforce_eager": cfg.enforce_eager,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "data_parallel_size": cfg.data_parallel_size,
        "seed": cfg.seed,
        "load_format": cfg.load_format,
        "enable_prefix_caching": False,
        "mm_processor_cache_gb": 0,
        "scheduling_policy": "priority",
        "limit_mm_per_prompt": {"image": 1},
        "renderer_num_workers": RENDERER_WORKERS,
    }
    optional = {
        "revision": cfg.revision,
        "tokenizer": cfg.tokenizer,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "block_size": cfg.block_size,
    }
    kwargs.update({key: value for key, value in optional.items() if value is not None})
    if uses_ngram_guard(cfg):
        kwargs["logits_processors"] = [NGRAM_PROCESSORS[cfg.ngram_processor]]
    kwargs.update(cfg.engine_args)
    if kwargs["mm_processor_cache_gb"] and "renderer_num_workers" not in cfg.engine_args:
        kwargs["renderer_num_workers"] = 1
    return kwargs


def replica_devices(cfg: VllmConfig, visible: str | None, count: int) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` for each replica: consecutive groups of ``tensor_parallel_size ×
    data_parallel_size`` of the GPUs this process may use (its own ``CUDA_VISIBLE_DEVICES``, else all
    ``count``); one replica inherits the environment unchanged."""
    if cfg.replicas == 1:
        return [None]
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(count)]
    per = cfg.tensor_parallel_size * cfg.data_parallel_size
    if cfg.replicas * per > len(ids):
        raise ConfigError(
            f"engine.vllm.replicas: {cfg.replicas} replicas of {per} GPU(s) need {cfg.replicas * per} GPUs, "
            f"{len(ids)} visible",
            hint="lower replicas (or tensor_parallel_size × data_parallel_size), or make more GPUs visible",
        )
    return [",".join(ids[i * per : (i + 1) * per]) for i in range(cfg.replicas)]


@contextmanager
def visible_devices(devices: str | None) -> Iterator[None]:
    """vLLM's engine core is a spawned process that reads ``CUDA_VISIBLE_DEVICES`` when it starts (vLLM pins
    its own data-parallel ranks the same way), so a replica is pinned by the variable while it is built."""
    if devices is None:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def uses_ngram_guard(cfg: VllmConfig) -> bool:
    """Any custom logits processor moves vLLM (0.26) from its V2 model runner to the older V1 one, whose host
    work per decode step made a step 20.6 ms instead of 13.8 ms on an H200 (8.5 against 11.2 pages/s,
    bench/README.md, run 6), so none is registered when no rung can use the guard."""
    rungs = [(cfg.ngram_size, cfg.window_size), *((r.ngram_size, r.window_size) for r in cfg.ladder)]
    return any(n > 0 and w > 0 for n, w in rungs)


def check_engine_args(kwargs: Mapping[str, Any], known: set[str], version: str) -> None:
    """Engine arguments differ between vLLM releases (0.33 dropped ``max_num_partial_prefills``,
    ``calculate_kv_scales`` and others): name the ones this vLLM lacks instead of a bare ``TypeError``."""
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(
            f"engine.vllm.engine_args: vLLM {version} has no engine argument {', '.join(map(repr, unknown))}",
            hint="remove it from [engine.vllm.engine_args] or install the vLLM release it belongs to",
        )


def sampling_kwargs(cfg: VllmConfig, sampling: Sampling) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one rung; the n-gram settings travel in ``extra_args`` to
    DeepSeek-OCR's ``NGramPerReqLogitsProcessor`` (off when ``ngram_size`` or ``window_size`` is 0)."""
    kwargs: dict[str, Any] = {
        "temperature": sampling.temperature,
        "max_tokens": sampling.max_tokens or cfg.max_tokens,
        "skip_special_tokens": False,
        "ignore_eos": cfg.ignore_eos,
    }
    if sampling.temperature > 0:
        kwargs["seed"] = cfg.seed
    if sampling.ngram_size > 0 and sampling.window_size > 0:
        kwargs["extra_args"] = {
            "ngram_size": sampling.ngram_size,
            "window_size": sampling.window_size,
            "whitelist_token_ids": list(cfg.whitelist_token_ids),
        }
    return kwargs


def vllm_priority(priority: int) -> int:
    """``PageRequest.priority`` is the scheduler's ``engine_priority``: lower runs first, as in vLLM's
    priority scheduler (``Request.__lt__``: priority, then arrival), so it passes unchanged; its values
    (up to about 10**10) fit the 64-bit integers of vLLM's msgpack transport."""
    return priority


def model_prompt(prompt: str) -> str:
    """DeepSeek-OCR needs exactly one image tag; a custom prompt without one gets it in front."""
    return prompt if IMAGE_TOKEN in prompt else f"{IMAGE_TOKEN}\n{prompt}"


def request_timings(metrics: Any) -> dict[str, float]:
    """Queue, first-token and decode seconds from ``RequestOutput.metrics`` (``RequestStateStats``, present
    in 0.26 and 0.33 while vLLM's stats are on); empty where vLLM kept none."""
    if metrics is None:
        return {}
    queued = getattr(metrics, "queued_ts", 0.0)
    scheduled = getattr(metrics, "scheduled_ts", 0.0)
    first = getattr(metrics, "first_token_ts", 0.0)
    last = getattr(metrics, "last_token_ts", 0.0)
    timings: dict[str, float] = {}
    if queued and scheduled >= queued:
        timings["queue"] = scheduled - queued
    if getattr(metrics, "first_token_latency", 0.0):
        timings["first_token"] = metrics.first_token_latency
    if first and last >= first:
        timings["decode"] = last - first
    return timings


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_cuda_failure(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    out_of_memory = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if isinstance(out_of_memory, type) and isinstance(exc, out_of_memory):
        return True
    return isinstance(exc, RuntimeError) and "CUDA" in str(exc)


def engine_error(exc: BaseException, dead_errors: tuple[type[BaseException], ...], *, errored: bool) -> OcrwatchError:
    """An engine exception as ocrwatch sees it: the engine is dead (rebuild it) or only this page failed."""
    for cause in _causes(exc):
        if isinstance(cause, dead_errors) or _is_cuda_failure(cause):
            return EngineDead(f"vLLM engine died: {type(cause).__name__}: {cause}")
    if errored:
        return EngineDead(f"vLLM engine died: {type(exc).__name__}: {exc}")
    return EngineFailed(f"vLLM request failed: {type(exc).__name__}: {exc}")


def recognition(
    output: Any, width: int, height: int, *, images: Images, page_index: int, timings: dict[str, float]
) -> Recognition:
    """A finished ``RequestOutput`` as a ``Recognition``; ``raw`` keeps the model's exact text."""
    completion = output.outputs[0]
    raw = completion.text
    parsed = layout.parse(raw, width, height, images=images, page_index=page_index)
    return Recognition(
        markdown=parsed.markdown,
        raw=raw,
        blocks=parsed.blocks,
        prompt_tokens=len(output.prompt_token_ids) if output.prompt_token_ids is not None else None,
        completion_tokens=len(completion.token_ids),
        finish_reason=completion.finish_reason,
        seconds=timings.get("total", 0.0),
        timings={**timings, **request_timings(getattr(output, "metrics", None))},
    )


class _Runtime:
    """The installed vLLM: the only code that calls its API (identical in 0.26 and 0.33 where used here)."""

    def __init__(self) -> None:
        import torch
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))  # torch read it before engine_env
        self.version: str = vllm.__version__
        self._engine_args = AsyncEngineArgs
        self._async_llm = AsyncLLM
        self._sampling_params = SamplingParams
        self._final_only = RequestOutputKind.FINAL_ONLY
        self._parse_prompt = parse_model_prompt
        self.dead_errors: tuple[type[BaseException], ...] = (EngineDeadError,)

    def engine(self, kwargs: dict[str, Any]) -> Any:
        check_engine_args(kwargs, {field.name for field in dataclasses.fields(self._engine_args)}, self.version)
        return self._async_llm.from_engine_args(self._engine_args(**kwargs))

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def sampling_params(self, kwargs: dict[str, Any]) -> Any:
        return self._sampling_params(**kwargs, output_kind=self._final_only)

    async def prepare(self, llm: Any, prompt: str, image: Image.Image) -> Any:
        """The page as an ``EngineInput``, processed in the renderer's threads (0.26: ``renderer_num_workers``
        threads; 0.33: a dedicated single multimodal thread), so the event loop never runs the processor."""
        parsed = self._parse_prompt(llm.model_config, {"prompt": prompt, "multi_modal_data": {"image": image}})
        (engine_input,) = await llm.renderer.render_cmpl_async([parsed])
        return engine_input


class VllmEngine:
    """DeepSeek-OCR(-2) in an embedded vLLM engine; see ``ocrwatch.engines.base`` for the contract."""

    name = "vllm"

    def __init__(self, cfg: VllmConfig, *, images: Images = "placeholder") -> None:
        self.cfg = cfg
        self.images = images
        self.geometry = geometry(cfg)
        self.render_hint = self.geometry.render_hint()
        self.max_concurrency = cfg.max_num_seqs * cfg.data_parallel_size * cfg.replicas
        self._runtime: _Runtime | None = None
        self._llms: list[Any] = []
        self._load: list[int] = []
        self._inflight: dict[str, asyncio.Task[Recognition]] = {}

    async def start(self) -> None:
        started = time.monotonic()
        os.environ.update(engine_env(self.cfg, os.environ))
        try:
            self._runtime = runtime = await asyncio.to_thread(_Runtime)
            devices = replica_devices(
                self.cfg,
                os.environ.get("CUDA_VISIBLE_DEVICES"),
                await asyncio.to_thread(runtime.device_count) if self.cfg.replicas > 1 else 0,
            )
            for replica in devices:  # one after the other: the second start finds the first's compile cache
                self._llms.append(await asyncio.to_thread(self._build, runtime, replica))
                self._load.append(0)
        except ConfigError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise EngineDead(
                f"vLLM engine could not start: {type(exc).__name__}: {exc}",
                hint="check [engine.vllm] model, GPU memory and the vLLM install; ocrwatch retries with backoff",
            ) from exc
        try:
            for index in range(len(self._llms)):
                await self._track(index, self._warmup_request())
        except BaseException as exc:
            await self.close()
            if isinstance(exc, OcrwatchError):
                raise EngineDead(f"vLLM engine failed its warm-up request: {exc.message}") from exc
            raise
        gc.collect()
        gc.freeze()  # see release(): what vLLM, torch and transformers built at start is never garbage
        log.info(
            "vllm_engine_ready",
            vllm=runtime.version,
            model=self.cfg.model,
            architecture=self.geometry.architecture,
            max_concurrency=self.max_concurrency,
            replicas=len(self._llms),
            devices=",".join(d for d in devices if d) or None,
            seconds=round(time.monotonic() - started, 2),
        )

    def _build(self, runtime: _Runtime, devices: str | None) -> Any:
        with visible_devices(devices):
            return runtime.engine(engine_kwargs(self.cfg))

    def _warmup_request(self) -> PageRequest:
        """One output token for a blank page at the tile geometry, so the first real page pays no
        first-use costs (the tile path of the processor and the vision encoder)."""
        size = (2 * self.geometry.tile_size, 3 * self.geometry.tile_size)
        return PageRequest(
            request_id=WARMUP_REQUEST_ID,
            image=Image.new("RGB", size, "white"),
            prompt=PROMPT_PRESETS["free"],
            sampling=Sampling(max_tokens=1, ngram_size=0),
        )

    async def recognize(self, page: PageRequest) -> Recognition:
        if not self._llms:
            raise EngineDead("vLLM engine is not running")
        return await self._track(min(range(len(self._load)), key=self._load.__getitem__), page)

    async def _track(self, index: int, page: PageRequest) -> Recognition:
        """``page`` on replica ``index``, counted in its load and kept where ``abort`` and ``close`` find it."""
        task = asyncio.ensure_future(self._recognize(self._llms[index], page))
        self._inflight[page.request_id] = task
        self._load[index] += 1
        try:
            return await task
        finally:
            self._load[index] -= 1
            if self._inflight.get(page.request_id) is task:
                del self._inflight[page.request_id]

    async def _recognize(self, llm: Any, page: PageRequest) -> Recognition:
        runtime = self._runtime
        if runtime is None:
            raise EngineDead("vLLM engine is not running")
        started = time.monotonic()
        width, height = page.image.size
        try:
            image = page.image if page.image.mode == "RGB" else await asyncio.to_thread(page.image.convert, "RGB")
            engine_input = await runtime.prepare(llm, model_prompt(page.prompt), image)
            prepared = time.monotonic()
            params = runtime.sampling_params(sampling_kwargs(self.cfg, page.sampling))
            final = None
            async for output in llm.generate(
                engine_input, params, page.request_id, priority=vllm_priority(page.priority)
            ):
                final = output
        except (asyncio.CancelledError, OcrwatchError):
            raise
        except Exception as exc:
            error = engine_error(exc, runtime.dead_errors, errored=bool(llm.errored))
            log.warning("vllm_request_failed", request_id=page.request_id, kind=error.kind, error=error.message)
            raise error from exc
        if final is None or not final.outputs:
            raise EngineFailed(f"vLLM returned no output for {page.request_id}")
        if final.outputs[0].finish_reason == "abort":
            raise asyncio.CancelledError(f"{page.request_id} aborted")
        finished = time.monotonic()
        timings = {"prepare": prepared - started, "total": finished - started}
        return await asyncio.to_thread(
            functools.partial(recognition, images=self.images, page_index=page.page_index, timings=timings),
            final,
            width,
            height,
        )

    async def abort(self, request_id: str) -> None:
        """Cancel ``request_id`` and its ladder attempts (``request_id/aN``); cancelling the task makes vLLM's
        ``generate()`` abort the request in the engine core."""
        prefix = f"{request_id}/"
        for key, task in list(self._inflight.items()):
            if key == request_id or key.startswith(prefix):
                task.cancel()

    def release(self) -> None:
        """The young generations only: a full ``gc.collect()`` walks the whole front end's heap (vLLM, torch,
        transformers: 630k objects, 0.34 s on the dev machine) and, run on the event loop after every document,
        held the loop for seconds whenever a wave of documents finished together (13.8 s worst lag on the
        H200 host, the GPU idle meanwhile; bench/README.md, runs 4 and 5). Python's own collector still runs
        full collections; ``start()`` freezes the start-up heap (``gc.freeze``, as vLLM's engine core does), so
        those walk only what came later (0.35 s → under 1 ms)."""
        gc.collect(1)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        llms, self._llms, self._load = self._llms, [], []
        for llm in llms:
            await asyncio.to_thread(llm.shutdown)
        gc.unfreeze()  # a rebuilt engine must not keep this one's objects out of the collector's reach
        self.release()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.cfg.model,
            "revision": self.cfg.revision,
            "architecture": self.geometry.architecture,
            "vllm": self._runtime.version if self._runtime is not None else None,
            "dtype": self.cfg.dtype,
            "max_model_len": self.cfg.max_model_len,
            "load_format": self.cfg.load_format,
            "replicas": self.cfg.replicas,
            "tensor_parallel_size": self.cfg.tensor_parallel_size,
            "data_parallel_size": self.cfg.data_parallel_size,
            "sampling": asdict(base_sampling(self.cfg)),
            "ladder": [rung.model_dump() for rung in self.cfg.ladder],
            "render_hint": asdict(self.render_hint),
        }
