"""The embedded vLLM engine: an in-process ``AsyncLLM`` (vLLM v1) serving DeepSeek-OCR-2 or
DeepSeek-OCR.

vLLM is imported in ``start()`` only, so this module imports on machines without it. Engine and
sampling arguments are built by pure functions (``arguments.engine_kwargs``, ``sampling_kwargs``)
that follow vLLM's DeepSeek-OCR recipe and are tested without vLLM; ``_Runtime`` is the one place
that touches vLLM's API, lives in ``runtime``.

Throughput needs many pages in flight (continuous batching does the batching) and a free event loop:
each page's multimodal input is prepared by vLLM's renderer in its worker threads
(``render_cmpl_async``), never in the loop, and the engine core runs in its own process.

One ``VllmEngine`` is one replica on one group of GPUs; ``[engine.vllm] replicas`` is several of
them behind ``engines.replicas.EngineSet`` (see ``engines.deepseek.spec``).
"""

from __future__ import annotations

import asyncio
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
from ocrwatch.engines.deepseek.arguments import (
    engine_env,
    engine_kwargs,
    engine_sizing,
    host_processor,
    model_prompt,
    platform_env,
    sampling_kwargs,
    uses_ngram_guard,
    visible_devices,
    vision,
    vllm_priority,
)
from ocrwatch.engines.deepseek.options import PROMPT_PRESETS, VllmConfig
from ocrwatch.engines.deepseek.platform import Platform, warmup_size
from ocrwatch.engines.deepseek.platform import describe as describe_platform
from ocrwatch.engines.deepseek.runtime import Runtime as _Runtime
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import ConfigError, EngineDead, EngineFailed, OcrwatchError

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
        self._platform: Platform | None = None

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
                hint="check [engine.vllm] model, GPU memory and the vLLM install (ocrwatch check "
                "probes them); a running daemon builds the engine again, with backoff",
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
        """Size the engine for the platform it gets (``engine_sizing``: a GPU, or the host's CPU),
        then build it."""
        with visible_devices(self.devices):
            self._platform = platform = runtime.platform()
            os.environ.update(platform_env(self.cfg, platform, os.environ))
            self.sizing = engine_sizing(self.cfg, platform)
            log.info(
                "vllm_platform",
                settings=describe_platform(
                    self.cfg, platform, self.sizing, host_processor=host_processor(self.cfg)
                ),
            )
            kwargs = engine_kwargs(self.cfg, self.sizing, platform=platform)
            self.max_concurrency = int(kwargs["max_num_seqs"]) * self.cfg.data_parallel_size
            fallback = None
            if uses_ngram_guard(self.cfg) and self.cfg.ngram_processor == "gpu":
                fallback = engine_kwargs(
                    self.cfg, self.sizing, processor="batched", platform=platform
                )
            return runtime.engine(kwargs, fallback)

    def _warmup_request(self) -> PageRequest:
        """One output token for a blank page (``platform.warmup_size``), so the first real page
        pays no first-use costs (the tile path of the processor and the vision encoder)."""
        size = warmup_size(self.vision, self._platform)
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
