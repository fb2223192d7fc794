"""A faster DeepSeek-OCR-2 for vLLM: the same weights and outputs, a batched vision encoder.

vLLM's own class (``vllm/model_executor/models/deepseek_ocr2.py``, 0.26.0) encodes the pages of a
batch one at a time: per page, the 1024x1024 global view at batch 1, then that page's 768x768 tiles,
a host sync (``torch.sum(...).item()``) per page, and, inside the Qwen2 "decoder as encoder", an
attention mask built by a Python loop that issues two indexing kernels per query token (~1,400
tiny kernels per page). The GPU sits mostly idle while Python launches kernels.

This subclass keeps every module and weight of the stock class and replaces only the path from
pixels to embeddings:

- all global views of the batch go through SAM, Qwen2 and the projector together, and all tiles
  together (in bounded chunks, so peak memory stays bounded);
- one host sync per batch (the tile counts), none per page;
- the Qwen2 mask (image tokens see each other, query tokens see all image tokens and the earlier
  queries) is one cached tensor, built without a loop;
- the SAM encoder's global-attention layers add the decomposed relative-position bias inside the
  attention kernel instead of materialising a (heads x 4096 x 4096) bias for an explicit-mask SDPA:
  ``flex`` (FlexAttention with a ``score_mod``) or ``concat`` (the bias folded into the dot product
  by appending the rel-pos terms to q and one-hot key coordinates to k, so a flash kernel runs), or
  ``sdpa`` (the stock arithmetic, batched).

Measured on an H200 (bench/README.md, 2026-11-29; 16 real pages of 6 tiles, bf16): vLLM's per-page loop
165 ms/page, this batched path with ``concat`` 30 ms/page, with ``flex`` 141 ms/page; both within the
stock path's own bf16 error of an fp32 reference.

It is selected by ``ocrwatch.engines.vllm_plugin`` (``OCRWATCH_FAST_ENCODER=1``). Knobs, read when the
model is built: ``OCRWATCH_SAM_ATTN`` (global layers: flex | concat | sdpa, default concat),
``OCRWATCH_SAM_WINDOW_ATTN`` (windowed layers: stock | concat, default stock; concat there is checked
equal in fp32 on a CPU, not yet timed on a GPU),
``OCRWATCH_ENCODER_CHUNK`` (global views per chunk) and ``OCRWATCH_TILE_CHUNK`` (tiles per chunk),
``OCRWATCH_ENCODER_GRAPHS`` (1: replay the encoder as CUDA graphs, ``ViewGraphs``; the chunks are then the
graphs' batch sizes),
``OCRWATCH_ENCODER_STATS`` (a file to which per-process encoder timings are written, from CUDA events
read without a sync). bench/gpu/encoder_check.py proves it equal to the stock class on random weights.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ocrwatch.engines import vllm_plugin

ATTN_IMPLS = ("flex", "concat", "sdpa", "stock")
DEFAULT_ATTN = "concat"


# --------------------------------------------------------------------------- Qwen2 encoder mask
_MASKS: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}


def prefix_lm_mask(n_query: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive mask of vLLM's ``CustomQwen2Decoder`` for ``n_query`` image tokens followed by
    ``n_query`` learned queries, as a (1, 1, 2n, 2n) tensor: 0 where key j is visible from query i
    (j < n, or j <= i), the dtype's minimum elsewhere. Cached per (n, dtype, device)."""
    key = (n_query, dtype, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        size = 2 * n_query
        i = torch.arange(size, device=device)[:, None]
        j = torch.arange(size, device=device)[None, :]
        allowed = (j < n_query) | (j <= i)
        mask = torch.full((size, size), torch.finfo(dtype).min, dtype=dtype, device=device)
        mask = mask.masked_fill(allowed, 0.0)[None, None]
        _MASKS[key] = mask
    return mask


def qwen2_encode(qwen2_model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """Same as vLLM's ``Qwen2Decoder2Encoder.forward`` for a whole batch, with the cached mask."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

    x = features.flatten(2).transpose(1, 2)
    bs, n_query, _ = x.shape
    if n_query == 144:
        queries = qwen2_model.query_768.weight
    elif n_query == 256:
        queries = qwen2_model.query_1024.weight
    else:
        raise ValueError(f"unexpected number of SAM tokens per view: {n_query}")
    x = torch.cat([x, queries.unsqueeze(0).expand(bs, -1, -1)], dim=1)
    mask = prefix_lm_mask(n_query, x.dtype, x.device).expand(bs, 1, 2 * n_query, 2 * n_query)
    inner = qwen2_model.model.model  # CustomQwen2Decoder -> its transformers Qwen2Model subclass
    out = Qwen2Model.forward(inner, inputs_embeds=x, attention_mask={"full_attention": mask}, use_cache=False)
    return out[0][:, n_query:, :]


# --------------------------------------------------------------------------- SAM attention
def _rel_pos_terms(attn: torch.nn.Module, q: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decomposed relative-position terms of the stock ``add_decomposed_rel_pos``:
    rel_h (B, heads, N, H) and rel_w (B, heads, N, W), from the unscaled q (B, heads, N, C)."""
    from vllm.model_executor.models.deepencoder import get_rel_pos

    rh = get_rel_pos(height, height, attn.rel_pos_h)
    rw = get_rel_pos(width, width, attn.rel_pos_w)
    b, nh, n, c = q.shape
    r_q = q.reshape(b * nh, height, width, c)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, rh).reshape(b, nh, n, height)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, rw).reshape(b, nh, n, width)
    return rel_h, rel_w


_ONE_HOT: dict[tuple[int, int, torch.dtype, str], torch.Tensor] = {}


def _key_coords(height: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(N, H + W): one-hot row and one-hot column of every key position."""
    key = (height, width, dtype, str(device))
    t = _ONE_HOT.get(key)
    if t is None:
        idx = torch.arange(height * width, device=device)
        t = torch.cat([F.one_hot(idx // width, height), F.one_hot(idx % width, width)], dim=-1).to(dtype)
        _ONE_HOT[key] = t
    return t


def _attn_sdpa(attn, q, k, v, height, width):
    rel_h, rel_w = _rel_pos_terms(attn, q, height, width)
    b, nh, n, _ = q.shape
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(b, nh, n, height * width)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _attn_concat(attn, q, k, v, height, width):
    """softmax(q.k*s + rel_h[kh] + rel_w[kw]) as one plain attention:
    [q*s, rel_h, rel_w] . [k, onehot(kh), onehot(kw)] = q.k*s + rel_h[kh] + rel_w[kw]."""
    rel_h, rel_w = _rel_pos_terms(attn, q, height, width)
    b, nh, n, c = q.shape
    coords = _key_coords(height, width, q.dtype, q.device).expand(b, nh, n, height + width)
    qa = torch.cat([q * attn.scale, rel_h, rel_w], dim=-1)
    ka = torch.cat([k, coords], dim=-1)
    d = qa.shape[-1]
    pad = (-d) % 8
    if pad:
        qa = F.pad(qa, (0, pad))
        ka = F.pad(ka, (0, pad))
    va = F.pad(v, (0, d + pad - c))  # equal head dims let SDPA pick a flash kernel
    return F.scaled_dot_product_attention(qa, ka, va, scale=1.0)[..., :c]


_FLEX: Callable[..., torch.Tensor] | None = None


def _flex_fn() -> Callable[..., torch.Tensor]:
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        dynamic = {"1": True, "0": False}.get(os.environ.get("OCRWATCH_FLEX_DYNAMIC", ""), None)
        _FLEX = torch.compile(flex_attention, dynamic=dynamic)
    return _FLEX


_FLEX_BROKEN: list[str] = []


def _attn_flex(attn, q, k, v, height, width):
    """FlexAttention with the bias as a score_mod: nothing of size N x N is materialised. If the
    compiled kernel cannot be built here, fall back to ``concat`` for the rest of the process."""
    if _FLEX_BROKEN:
        return _attn_concat(attn, q, k, v, height, width)
    rel_h, rel_w = _rel_pos_terms(attn, q, height, width)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + rel_h[b, h, q_idx, kv_idx // width] + rel_w[b, h, q_idx, kv_idx % width]

    try:
        return _flex_fn()(q.contiguous(), k.contiguous(), v.contiguous(), score_mod=score_mod)
    except Exception as exc:  # noqa: BLE001 - any compile failure: keep serving with concat
        _FLEX_BROKEN.append(f"{type(exc).__name__}: {exc}"[:300])
        import warnings

        warnings.warn(f"ocrwatch: FlexAttention unavailable, using concat: {_FLEX_BROKEN[0]}", stacklevel=1)
        return _attn_concat(attn, q, k, v, height, width)


_IMPLS = {"sdpa": _attn_sdpa, "concat": _attn_concat, "flex": _attn_flex}


def rel_pos_attention(attn: torch.nn.Module, x: torch.Tensor, impl: str) -> torch.Tensor:
    """vLLM's ``RelPosAttention.forward`` with a choice of attention kernel; x is (B, H, W, C)."""
    if impl == "stock" or not attn.use_rel_pos:
        return attn(x)
    b, height, width, _ = x.shape
    nh = attn.num_heads
    qkv = attn.qkv(x).reshape(b, height * width, 3, nh, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, heads, N, C)
    out = _IMPLS[impl](attn, q, k, v, height, width)
    out = out.reshape(b, nh, height, width, -1).permute(0, 2, 3, 1, 4).reshape(b, height, width, -1)
    return attn.proj(out)


def sam_encode(sam: torch.nn.Module, x: torch.Tensor, global_impl: str, window_impl: str = "stock") -> torch.Tensor:
    """vLLM's ``ImageEncoderViT.forward`` with the attention kernel chosen per layer kind."""
    from vllm.model_executor.models.deepencoder import (
        window_partition,
        window_unpartition,
    )

    x = sam.patch_embed(x)
    if sam.pos_embed is not None:
        x = x + sam.get_abs_pos(sam.pos_embed, x.size(1))
    for blk in sam.blocks:
        shortcut = x
        y = blk.norm1(x)
        if blk.window_size > 0:
            height, width = y.shape[1], y.shape[2]
            y, pad_hw = window_partition(y, blk.window_size)
            y = rel_pos_attention(blk.attn, y, window_impl)
            y = window_unpartition(y, blk.window_size, pad_hw, (height, width))
        else:
            y = rel_pos_attention(blk.attn, y, global_impl)
        x = shortcut + y
        x = x + blk.mlp(blk.norm2(x))
    neck = sam.neck(x.permute(0, 3, 1, 2))
    return sam.net_3(sam.net_2(neck))


# --------------------------------------------------------------------------- whole vision path
def encode_chunk(model: Any, views: torch.Tensor, global_impl: str, window_impl: str) -> torch.Tensor:
    """SAM -> Qwen2 -> projector for a stack of same-size views: (views, tokens_per_view, n_embed)."""
    feats = sam_encode(model.sam_model, views, global_impl, window_impl)
    return model.projector(qwen2_encode(model.qwen2_model, feats))


GRAPH_SIZES = {1024: (1, 2, 3, 4, 6, 8, 12, 16), 768: (6, 12, 18, 24, 36, 48)}
"""Batch sizes captured per view side: global views come one per page, 768 tiles six per A4/Letter page."""


class ViewGraphs:
    """CUDA graphs of ``encode_chunk`` for each view side and batch size of ``GRAPH_SIZES``; a batch is padded
    with blank views up to the next size, and a larger one runs as several graphs.

    Why: run eagerly, the encoder launches thousands of small kernels from Python, one at a time. On the
    H200 host the engine core's only thread spent 48 % of its time there (34 % in Qwen2's layers alone) while
    the GPU idled (bench/README.md, run 4). A replay launches them all at once. Views never interact inside
    the encoder, so padding changes no view's output beyond the kernels' bf16 rounding (checked by
    bench/gpu/encoder_check.py). All sizes of a side are captured the first time that side is seen, which
    is vLLM's memory-profiling run, so the graphs' memory is counted before the KV cache is sized."""

    def __init__(self, model: Any, global_impl: str, window_impl: str, sizes: dict[int, tuple[int, ...]] | None = None):
        self.model, self.global_impl, self.window_impl = model, global_impl, window_impl
        self.sizes = sizes or GRAPH_SIZES
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool: Any = None

    def __call__(self, views: torch.Tensor) -> torch.Tensor:
        side = views.shape[-1]
        sizes = self.sizes.get(side)
        if sizes is None:  # a view size no graph was made for: eager, as before
            return encode_chunk(self.model, views, self.global_impl, self.window_impl)
        with torch.inference_mode():  # the static buffers are inference tensors (made in vLLM's profiling run)
            if (side, sizes[0]) not in self.graphs:
                self._capture_side(side, sizes, views.dtype, views.device)
            outs = []
            for start in range(0, views.shape[0], sizes[-1]):
                part = views[start : start + sizes[-1]]
                n = part.shape[0]
                graph, static_in, static_out = self.graphs[(side, next(size for size in sizes if size >= n))]
                static_in[:n].copy_(part)
                static_in[n:].zero_()
                graph.replay()
                outs.append(static_out[:n].clone())  # the next replay overwrites static_out
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _capture_side(self, side: int, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        for size in sorted(sizes, reverse=True):  # the largest first, so the smaller reuse its pool memory
            static_in = torch.zeros((size, 3, side, side), dtype=dtype, device=device)
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):  # warm-up outside the graph: lazy inits, caches, kernel choice
                for _ in range(2):
                    encode_chunk(self.model, static_in, self.global_impl, self.window_impl)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                static_out = encode_chunk(self.model, static_in, self.global_impl, self.window_impl)
            self.pool = graph.pool()
            self.graphs[(side, size)] = (graph, static_in, static_out)


def encode_views(
    model: Any, views: torch.Tensor, chunk: int, global_impl: str, window_impl: str, graphs: ViewGraphs | None = None
) -> torch.Tensor:
    """``encode_chunk`` for a stack of same-size views, ``chunk`` views at a time, or through ``graphs``.
    Returns (views, tokens_per_view, n_embed)."""
    if graphs is not None:
        return graphs(views)
    outs = [encode_chunk(model, views[start : start + chunk], global_impl, window_impl) for start in range(0, views.shape[0], chunk)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def pages_to_embeddings(
    model: Any,
    pixel_values: torch.Tensor,
    images_crop: torch.Tensor | None,
    images_spatial_crop: torch.Tensor,
    *,
    global_impl: str = DEFAULT_ATTN,
    window_impl: str = "stock",
    global_chunk: int = 16,
    tile_chunk: int = 48,
    graphs: ViewGraphs | None = None,
) -> list[torch.Tensor]:
    """Batched equivalent of ``DeepseekOCR2ForCausalLM._pixel_values_to_embedding``: per page,
    [tile tokens..., global-view tokens, view separator]."""
    crops = images_spatial_crop.tolist()  # the one host sync of the batch
    tiles = [w * h if (w > 1 or h > 1) else 0 for w, h in crops]
    n_pages = len(crops)
    glob = encode_views(model, pixel_values[:n_pages], global_chunk, global_impl, window_impl, graphs)
    n_tiles = sum(tiles)
    local = None
    if n_tiles:
        local = encode_views(model, images_crop[:n_tiles], tile_chunk, global_impl, window_impl, graphs)
    dim = glob.shape[-1]
    sep = model.view_seperator[None, :]
    out, pos = [], 0
    for page, count in enumerate(tiles):
        if count:
            out.append(torch.cat([local[pos : pos + count].reshape(-1, dim), glob[page], sep], dim=0))
            pos += count
        else:
            out.append(torch.cat([glob[page], sep], dim=0))
    return out


class EncoderStats:
    """Per-process encoder timings from CUDA events, read once the GPU has passed them: a sync per call would
    stall vLLM's overlap of the next step's host work with this one's GPU work.  Written as JSON."""

    def __init__(self, path: str):
        self.path = f"{path}.{os.getpid()}"
        self.calls = self.pages = self.tiles = 0
        self.gpu_s = self.launch_s = 0.0
        self.batch_sizes: dict[int, int] = {}
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int, int, float]] = deque()

    def record(self, start: torch.cuda.Event, end: torch.cuda.Event, pages: int, tiles: int, launch_s: float) -> None:
        """Queue this call; count every earlier call whose end event the GPU has passed."""
        self._pending.append((start, end, pages, tiles, launch_s))
        done = 0
        while self._pending and self._pending[0][1].query():
            began, ended, n_pages, n_tiles, launched = self._pending.popleft()
            self.calls += 1
            self.pages += n_pages
            self.tiles += n_tiles
            self.gpu_s += began.elapsed_time(ended) / 1000
            self.launch_s += launched
            self.batch_sizes[n_pages] = self.batch_sizes.get(n_pages, 0) + 1
            done += 1
        if done:
            self._write()

    def _write(self) -> None:
        fields = {key: value for key, value in self.__dict__.items() if not key.startswith("_")}
        fields["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(fields, handle)
        os.replace(tmp, self.path)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _make_class():
    from vllm.logger import init_logger
    from vllm.model_executor.models.deepseek_ocr import DeepseekOCRImagePixelInputs
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

    class FastDeepseekOCR2ForCausalLM(DeepseekOCR2ForCausalLM):
        """DeepSeek-OCR-2 with a batched vision encoder; weights and outputs as the stock class."""

        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.ocw_global_impl = os.environ.get("OCRWATCH_SAM_ATTN", DEFAULT_ATTN)
            self.ocw_window_impl = os.environ.get("OCRWATCH_SAM_WINDOW_ATTN", "stock")
            for name, impl in (("OCRWATCH_SAM_ATTN", self.ocw_global_impl), ("OCRWATCH_SAM_WINDOW_ATTN", self.ocw_window_impl)):
                if impl not in ATTN_IMPLS:
                    raise ValueError(f"{name}={impl!r}: expected one of {ATTN_IMPLS}")
            sdpa_like = self.ocw_global_impl in ("sdpa", "stock")
            self.ocw_global_chunk = _env_int("OCRWATCH_ENCODER_CHUNK", 4 if sdpa_like else 16)
            self.ocw_tile_chunk = _env_int("OCRWATCH_TILE_CHUNK", 12 if sdpa_like else 48)
            stats = os.environ.get("OCRWATCH_ENCODER_STATS")
            self.ocw_stats = EncoderStats(stats) if stats else None
            graphs = vllm_plugin.enabled(name=vllm_plugin.GRAPHS_ENV)
            self.ocw_graphs = ViewGraphs(self, self.ocw_global_impl, self.ocw_window_impl) if graphs else None
            init_logger("vllm.ocrwatch.deepseek_ocr2_fast").info(
                "ocrwatch: fast DeepSeek-OCR-2 vision encoder active (global attention %s, windowed %s, chunks %d/%d, "
                "CUDA graphs %s)",
                self.ocw_global_impl, self.ocw_window_impl, self.ocw_global_chunk, self.ocw_tile_chunk,
                "on" if graphs else "off",
            )

        def _parse_and_validate_image_input(self, **kwargs: object):
            pixel_values = kwargs.pop("pixel_values", None)
            images_spatial_crop = kwargs.pop("images_spatial_crop", None)
            images_crop = kwargs.pop("images_crop", None)
            if pixel_values is None:  # the stock class also syncs on torch.sum(pixel_values) here
                return None
            return DeepseekOCRImagePixelInputs(
                type="pixel_values",
                data=pixel_values,
                images_crop=images_crop,
                images_spatial_crop=images_spatial_crop,
                resolve_bindings={"base_size": self.vision_config.image_size},
            )

        def _pixel_values_to_embedding(self, pixel_values, images_crop, images_spatial_crop):
            stats = self.ocw_stats
            if stats is not None:
                t0 = time.perf_counter()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            out = pages_to_embeddings(
                self, pixel_values, images_crop, images_spatial_crop,
                global_impl=self.ocw_global_impl, window_impl=self.ocw_window_impl,
                global_chunk=self.ocw_global_chunk, tile_chunk=self.ocw_tile_chunk, graphs=self.ocw_graphs,
            )
            if stats is not None:
                end.record()
                n_tiles = int(images_crop.shape[0]) if images_crop is not None else 0
                stats.record(start, end, len(out), n_tiles, time.perf_counter() - t0)
            return out

    FastDeepseekOCR2ForCausalLM.__module__ = __name__
    FastDeepseekOCR2ForCausalLM.__qualname__ = "FastDeepseekOCR2ForCausalLM"
    return FastDeepseekOCR2ForCausalLM


def __getattr__(name: str):
    # The class is built on first access: importing this module needs torch but not vLLM (the plugin,
    # ocrwatch.engines.vllm_plugin, needs neither and only names this module for vLLM to import).
    if name == "FastDeepseekOCR2ForCausalLM":
        cls = _make_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
