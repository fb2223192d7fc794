"""The embedded vLLM engine: an in-process ``AsyncLLM`` (vLLM v1) serving DeepSeek-OCR-2 or
DeepSeek-OCR.

vLLM is imported in ``start()`` only, so this module imports on machines without it. Engine and
sampling arguments are built by pure functions (``arguments.engine_kwargs``, ``sampling_kwargs``)
that follow vLLM's DeepSeek-OCR recipe and are tested without vLLM; ``_Runtime`` is the one place
that touches vLLM's API, checked against vLLM 0.26.0 and 0.33.0.

Throughput needs many pages in flight (continuous batching does the batching) and a free event loop:
each page's multimodal input is prepared by vLLM's renderer in its worker threads
(``render_cmpl_async``), never in the loop, and the engine core runs in its own process.

One ``VllmEngine`` is one replica on one group of GPUs; ``[engine.vllm] replicas`` is several of
them behind ``engines.replicas.EngineSet`` (see ``engines.deepseek.spec``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import structlog
from PIL import Image

from ocrwatch.engines.base import Images, PageRequest, Recognition
from ocrwatch.engines.deepseek import grounding
from ocrwatch.engines.deepseek.options import PROMPT_PRESETS, VllmConfig
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import ConfigError, EngineDead, EngineFailed, OcrwatchError
from ocrwatch.engines.deepseek.arguments import (
    vision,
    engine_sizing,
    engine_env,
    engine_kwargs,
    visible_devices,
    uses_ngram_guard,
    check_engine_args,
    sampling_kwargs,
    vllm_priority,
    model_prompt,
)

log = structlog.get_logger()

WARMUP_REQUEST_ID = "ocrwatch-warmup"


def request_timings(metrics: Any) -> dict[str, float]:
    """Queue, first-token and decode seconds from ``RequestOutput.metrics`` (``RequestStateStats``,
    present in 0.26 and 0.33 while vLLM's stats are on); empty where vLLM kept none."""
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


def engine_error(
    exc: BaseException, dead_errors: tuple[type[BaseException], ...], *, errored: bool
) -> OcrwatchError:
    """An engine exception as ocrwatch sees it: the engine is dead (rebuild it) or only this page
    failed."""
    for cause in _causes(exc):
        if isinstance(cause, dead_errors) or _is_cuda_failure(cause):
            return EngineDead(f"vLLM engine died: {type(cause).__name__}: {cause}")
    if errored:
        return EngineDead(f"vLLM engine died: {type(exc).__name__}: {exc}")
    return EngineFailed(f"vLLM request failed: {type(exc).__name__}: {exc}")


def recognition(
    output: Any,
    width: int,
    height: int,
    *,
    images: Images,
    page_index: int,
    timings: dict[str, float],
) -> Recognition:
    """A finished ``RequestOutput`` as a ``Recognition``; ``raw`` keeps the model's exact text."""
    completion = output.outputs[0]
    raw = completion.text
    parsed = grounding.parse(raw, width, height, images=images, page_index=page_index)
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
    """The installed vLLM: the only code that calls its API (identical in 0.26 and 0.33 where used
    here)."""

    def __init__(self) -> None:
        import torch
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import (
            RepetitionDetectionParams,
            RequestOutputKind,
            SamplingParams,
        )
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        # torch read it before engine_env
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        self.version: str = vllm.__version__
        self._engine_args = AsyncEngineArgs
        self._usage = UsageContext.ENGINE_CONTEXT
        self._async_llm = AsyncLLM
        self._sampling_params = SamplingParams
        self._repetition = RepetitionDetectionParams
        self._final_only = RequestOutputKind.FINAL_ONLY
        self._parse_prompt = parse_model_prompt
        self.dead_errors: tuple[type[BaseException], ...] = (EngineDeadError,)

    def engine(self, kwargs: dict[str, Any], fallback: dict[str, Any] | None = None) -> Any:
        """The engine. ``fallback``: the arguments to build with instead where vLLM would not run
        its V2 model runner, which the GPU n-gram guard needs (``AsyncLLM.from_engine_args`` in its
        two steps, to see the runner vLLM chose before starting it)."""
        check_engine_args(
            kwargs, {field.name for field in dataclasses.fields(self._engine_args)}, self.version
        )
        args = self._engine_args(**kwargs)
        if fallback is None:
            return self._async_llm.from_engine_args(args)
        config = args.create_engine_config(self._usage)
        if not getattr(config, "use_v2_model_runner", False):
            log.warning(
                "vllm_ngram_guard_on_the_host",
                reason="vLLM chose its V1 model runner",
                processor="batched",
            )
            return self.engine(fallback)
        return self._async_llm.from_vllm_config(
            config,
            usage_context=self._usage,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
        )

    def gpu_memory(self) -> int | None:
        """Total memory of the first GPU this process sees (NVML, through vLLM's platform); None if
        unknown."""
        try:
            from vllm.platforms import current_platform

            return int(current_platform.get_device_total_memory(0))
        except Exception:  # noqa: BLE001 - no GPU or no NVML: the sizing rule falls back
            return None

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def sampling_params(self, kwargs: dict[str, Any]) -> Any:
        stop = kwargs.get("repetition_detection")
        if isinstance(stop, dict):
            kwargs = {**kwargs, "repetition_detection": self._repetition(**stop)}
        return self._sampling_params(**kwargs, output_kind=self._final_only)

    async def prepare(self, llm: Any, prompt: str, image: Image.Image) -> Any:
        """The page as an ``EngineInput``, processed in the renderer's threads (0.26:
        ``renderer_num_workers`` threads; 0.33: a dedicated single multimodal thread), so the event
        loop never runs the processor."""
        parsed = self._parse_prompt(
            llm.model_config, {"prompt": prompt, "multi_modal_data": {"image": image}}
        )
        (engine_input,) = await llm.renderer.render_cmpl_async([parsed])
        return engine_input


class VllmEngine:
    """DeepSeek-OCR(-2) in an embedded vLLM engine on the GPUs ``devices`` names (None: those this
    process sees); see ``ocrwatch.engines.base`` for the contract."""

    name = "vllm"

    def __init__(
        self, cfg: VllmConfig, *, images: Images = "placeholder", devices: str | None = None
    ) -> None:
        self.cfg = cfg
        self.images = images
        self.devices = devices
        self.vision = vision(cfg)
        self.geometry = self.vision.page_geometry()
        self.sizing = engine_sizing(cfg, None)  # the GPU's memory is read at start
        self.max_concurrency = self.sizing.max_num_seqs * cfg.data_parallel_size
        self._runtime: _Runtime | None = None
        self._llm: Any = None
        self._inflight: dict[str, asyncio.Task[Recognition]] = {}

    async def start(self) -> None:
        started = time.monotonic()
        os.environ.update(engine_env(self.cfg, os.environ))
        try:
            self._runtime = runtime = await asyncio.to_thread(_Runtime)
            imported = time.monotonic()
            self._llm = await asyncio.to_thread(self._build, runtime)
            built = time.monotonic()
        except ConfigError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise EngineDead(
                f"vLLM engine could not start: {type(exc).__name__}: {exc}",
                hint="check [engine.vllm] model, GPU memory and the vLLM install; ocrwatch "
                "retries with backoff",
            ) from exc
        try:
            await self.recognize(self._warmup_request())
            warmed = time.monotonic()
        except BaseException as exc:
            await self.close()
            if isinstance(exc, OcrwatchError):
                raise EngineDead(f"vLLM engine failed its warm-up request: {exc.message}") from exc
            raise
        gc.collect()
        # see release(): what vLLM, torch and transformers built at start is never garbage
        gc.freeze()
        log.info(
            "vllm_engine_ready",
            vllm=runtime.version,
            model=self.cfg.model,
            architecture=self.vision.architecture,
            max_concurrency=self.max_concurrency,
            max_num_batched_tokens=self.sizing.max_num_batched_tokens,
            sizing=self.sizing.source,
            devices=self.devices,
            seconds=round(time.monotonic() - started, 2),
            seconds_import=round(imported - started, 2),
            seconds_engine=round(built - imported, 2),
            seconds_warmup=round(warmed - built, 2),
        )

    def _build(self, runtime: _Runtime) -> Any:
        """Size the engine for the GPU it gets (``engine_sizing``), then build it."""
        with visible_devices(self.devices):
            self.sizing = engine_sizing(self.cfg, runtime.gpu_memory())
            kwargs = engine_kwargs(self.cfg, self.sizing)
            self.max_concurrency = int(kwargs["max_num_seqs"]) * self.cfg.data_parallel_size
            fallback = None
            if uses_ngram_guard(self.cfg) and self.cfg.ngram_processor == "gpu":
                fallback = engine_kwargs(self.cfg, self.sizing, processor="batched")
            return runtime.engine(kwargs, fallback)

    def _warmup_request(self) -> PageRequest:
        """One output token for a blank page at the tile geometry, so the first real page pays no
        first-use costs (the tile path of the processor and the vision encoder)."""
        size = (2 * self.vision.tile_size, 3 * self.vision.tile_size)
        return PageRequest(
            request_id=WARMUP_REQUEST_ID,
            image=Image.new("RGB", size, "white"),
            prompt=PROMPT_PRESETS["free"],
            sampling=Sampling(max_tokens=1, ngram_size=0),
        )

    async def recognize(self, page: PageRequest) -> Recognition:
        """``page`` in a task of its own, kept where ``abort`` and ``close`` find it."""
        if self._llm is None:
            raise EngineDead("vLLM engine is not running")
        task = asyncio.ensure_future(self._recognize(self._llm, page))
        self._inflight[page.request_id] = task
        try:
            return await task
        finally:
            if self._inflight.get(page.request_id) is task:
                del self._inflight[page.request_id]

    async def _recognize(self, llm: Any, page: PageRequest) -> Recognition:
        runtime = self._runtime
        if runtime is None:
            raise EngineDead("vLLM engine is not running")
        started = time.monotonic()
        width, height = page.image.size
        try:
            image = (
                page.image
                if page.image.mode == "RGB"
                else await asyncio.to_thread(page.image.convert, "RGB")
            )
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
            log.warning(
                "vllm_request_failed",
                request_id=page.request_id,
                kind=error.kind,
                error=error.message,
            )
            raise error from exc
        if final is None or not final.outputs:
            raise EngineFailed(f"vLLM returned no output for {page.request_id}")
        if final.outputs[0].finish_reason == "abort":
            raise asyncio.CancelledError(f"{page.request_id} aborted")
        finished = time.monotonic()
        timings = {"prepare": prepared - started, "total": finished - started}
        return await asyncio.to_thread(
            functools.partial(
                recognition, images=self.images, page_index=page.page_index, timings=timings
            ),
            final,
            width,
            height,
        )

    async def abort(self, request_id: str) -> None:
        """Cancel ``request_id`` and its ladder attempts (``request_id/aN``); cancelling the task
        makes vLLM's ``generate()`` abort the request in the engine core."""
        prefix = f"{request_id}/"
        for key, task in list(self._inflight.items()):
            if key == request_id or key.startswith(prefix):
                task.cancel()

    def release(self) -> None:
        """The young generations only: a full ``gc.collect()`` walks the whole front end's heap
        (vLLM, torch, transformers: 630k objects, a third of a second) and, run on the event loop
        after every document, held the loop for seconds whenever a wave of documents finished
        together, the GPU idle meanwhile. Python's own collector still runs full collections;
        ``start()`` freezes the start-up heap (``gc.freeze``, as vLLM's engine core does), so those
        walk only what came later (0.35 s → under 1 ms)."""
        gc.collect(1)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
        # a rebuilt engine must not keep this one's objects out of the collector's reach
        gc.unfreeze()
        self.release()

    def describe(self) -> dict[str, Any]:
        cfg = self.cfg
        first = cfg.first_rung()
        return {
            "name": self.name,
            "model": self.cfg.model,
            "revision": self.cfg.revision,
            "architecture": self.vision.architecture,
            "vllm": self._runtime.version if self._runtime is not None else None,
            "dtype": self.cfg.dtype,
            "max_model_len": self.cfg.max_model_len,
            "load_format": self.cfg.load_format,
            "replicas": self.cfg.replicas,
            "tensor_parallel_size": self.cfg.tensor_parallel_size,
            "data_parallel_size": self.cfg.data_parallel_size,
            "sampling": asdict(
                first
            ),  # the first rung as configured (greedy); the ladder's rungs follow
            "guard": self.cfg.guard,
            "ladder": [rung.model_dump() for rung in self.cfg.ladder],
            "geometry": asdict(self.geometry),
        }
