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
- the SAM encoder's global-attention layers fold the decomposed relative-position bias into the dot
  product (the rel-pos terms appended to q, one-hot key coordinates to k), so a flash attention
  kernel runs instead of an explicit-mask SDPA over a (heads x 4096 x 4096) bias. Of the kernels
  tried (FlexAttention with a ``score_mod``, the stock arithmetic batched) this was the fastest on
  an H200, several times faster than vLLM's per-page path, and within the stock path's own bf16
  error of an fp32 reference. The windowed layers keep vLLM's own attention.

It is selected by ``ocrwatch.engines.deepseek.plugin`` (``[engine.vllm] fast_encoder``), and replays
the encoder as CUDA graphs (``ViewGraphs``) with ``[engine.vllm] encoder_cuda_graphs``.
bench/gpu/encoder_check.py proves it equal to the stock class on random weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ocrwatch.engines.deepseek import plugin

GLOBAL_CHUNK = 16
"""Global views encoded at once (one per page); bounds the encoder's peak memory."""
TILE_CHUNK = 48
"""Tiles encoded at once (six per A4 or Letter page)."""


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
    out = Qwen2Model.forward(
        inner, inputs_embeds=x, attention_mask={"full_attention": mask}, use_cache=False
    )
    return out[0][:, n_query:, :]


# --------------------------------------------------------------------------- SAM attention
def _rel_pos_terms(
    attn: torch.nn.Module, q: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
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
        t = torch.cat([F.one_hot(idx // width, height), F.one_hot(idx % width, width)], dim=-1).to(
            dtype
        )
        _ONE_HOT[key] = t
    return t


def _concat_attention(
    attn: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    height: int,
    width: int,
) -> torch.Tensor:
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


def rel_pos_attention(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vLLM's ``RelPosAttention.forward`` with the bias folded into the attention kernel; x is (B,
    H, W, C)."""
    if not attn.use_rel_pos:
        return attn(x)
    b, height, width, _ = x.shape
    nh = attn.num_heads
    qkv = attn.qkv(x).reshape(b, height * width, 3, nh, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, heads, N, C)
    out = _concat_attention(attn, q, k, v, height, width)
    out = out.reshape(b, nh, height, width, -1).permute(0, 2, 3, 1, 4).reshape(b, height, width, -1)
    return attn.proj(out)


def sam_encode(sam: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vLLM's ``ImageEncoderViT.forward``, its global-attention layers through
    ``rel_pos_attention``."""
    from vllm.model_executor.models.deepencoder import window_partition, window_unpartition

    x = sam.patch_embed(x)
    if sam.pos_embed is not None:
        x = x + sam.get_abs_pos(sam.pos_embed, x.size(1))
    for blk in sam.blocks:
        shortcut = x
        y = blk.norm1(x)
        if blk.window_size > 0:
            height, width = y.shape[1], y.shape[2]
            y, pad_hw = window_partition(y, blk.window_size)
            y = blk.attn(y)
            y = window_unpartition(y, blk.window_size, pad_hw, (height, width))
        else:
            y = rel_pos_attention(blk.attn, y)
        x = shortcut + y
        x = x + blk.mlp(blk.norm2(x))
    neck = sam.neck(x.permute(0, 3, 1, 2))
    return sam.net_3(sam.net_2(neck))


# --------------------------------------------------------------------------- whole vision path
def encode_chunk(model: Any, views: torch.Tensor) -> torch.Tensor:
    """SAM -> Qwen2 -> projector for a stack of same-size views: (views, tokens_per_view,
    n_embed)."""
    return model.projector(qwen2_encode(model.qwen2_model, sam_encode(model.sam_model, views)))


GRAPH_SIZES = {1024: (1, 2, 3, 4, 6, 8, 12, 16), 768: (6, 12, 18, 24, 36, 48)}
"""Batch sizes captured per view side: global views come one per page, 768 tiles six per A4/Letter
page."""


class ViewGraphs:
    """CUDA graphs of ``encode_chunk`` for each view side and batch size of ``GRAPH_SIZES``; a batch
    is padded with blank views up to the next size, and a larger one runs as several graphs.

    Why: run eagerly, the encoder launches thousands of small kernels from Python, one at a time,
    and the engine core's only thread spent about half its time there while the GPU idled. A replay
    launches them all at once. Views never interact inside the encoder, so padding changes no view's
    output beyond the kernels' bf16 rounding (checked by bench/gpu/encoder_check.py). All sizes of a
    side are captured the first time that side is seen, which is vLLM's memory-profiling run, so the
    graphs' memory is counted before the KV cache is sized."""

    def __init__(self, model: Any, sizes: dict[int, tuple[int, ...]] | None = None) -> None:
        self.model = model
        self.sizes = sizes or GRAPH_SIZES
        self.graphs: dict[
            tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]
        ] = {}
        self.pool: Any = None

    def __call__(self, views: torch.Tensor) -> torch.Tensor:
        side = views.shape[-1]
        sizes = self.sizes.get(side)
        if sizes is None:  # a view size no graph was made for: eager, as before
            return encode_chunk(self.model, views)
        # the static buffers are inference tensors (made in vLLM's profiling run)
        with torch.inference_mode():
            if (side, sizes[0]) not in self.graphs:
                self._capture_side(side, sizes, views.dtype, views.device)
            outs = []
            for start in range(0, views.shape[0], sizes[-1]):
                part = views[start : start + sizes[-1]]
                n = part.shape[0]
                graph, static_in, static_out = self.graphs[
                    (side, next(size for size in sizes if size >= n))
                ]
                static_in[:n].copy_(part)
                static_in[n:].zero_()
                graph.replay()
                outs.append(static_out[:n].clone())  # the next replay overwrites static_out
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _capture_side(
        self, side: int, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        # the largest first, so the smaller reuse its pool memory
        for size in sorted(sizes, reverse=True):
            static_in = torch.zeros((size, 3, side, side), dtype=dtype, device=device)
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            # warm-up outside the graph: lazy inits, caches, kernel choice
            with torch.cuda.stream(stream):
                for _ in range(2):
                    encode_chunk(self.model, static_in)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                static_out = encode_chunk(self.model, static_in)
            self.pool = graph.pool()
            self.graphs[(side, size)] = (graph, static_in, static_out)


def encode_views(
    model: Any, views: torch.Tensor, chunk: int, graphs: ViewGraphs | None = None
) -> torch.Tensor:
    """``encode_chunk`` for a stack of same-size views, ``chunk`` views at a time, or through
    ``graphs``. Returns (views, tokens_per_view, n_embed)."""
    if graphs is not None:
        return graphs(views)
    outs = [
        encode_chunk(model, views[start : start + chunk])
        for start in range(0, views.shape[0], chunk)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def pages_to_embeddings(
    model: Any,
    pixel_values: torch.Tensor,
    images_crop: torch.Tensor | None,
    images_spatial_crop: torch.Tensor,
    *,
    global_chunk: int = GLOBAL_CHUNK,
    tile_chunk: int = TILE_CHUNK,
    graphs: ViewGraphs | None = None,
) -> list[torch.Tensor]:
    """Batched equivalent of ``DeepseekOCR2ForCausalLM._pixel_values_to_embedding``: per page,
    [tile tokens..., global-view tokens, view separator]."""
    crops = images_spatial_crop.tolist()  # the one host sync of the batch
    tiles = [w * h if (w > 1 or h > 1) else 0 for w, h in crops]
    n_pages = len(crops)
    glob = encode_views(model, pixel_values[:n_pages], global_chunk, graphs)
    n_tiles = sum(tiles)
    local = None
    if n_tiles:
        assert images_crop is not None  # vLLM passes the crops whenever a page has tiles
        local = encode_views(model, images_crop[:n_tiles], tile_chunk, graphs)
    dim = glob.shape[-1]
    sep = model.view_seperator[None, :]
    out, pos = [], 0
    for page, count in enumerate(tiles):
        if count:
            assert local is not None  # a page with tiles: they were encoded above
            out.append(
                torch.cat([local[pos : pos + count].reshape(-1, dim), glob[page], sep], dim=0)
            )
            pos += count
        else:
            out.append(torch.cat([glob[page], sep], dim=0))
    return out


def _make_class() -> type:
    from vllm.logger import init_logger
    from vllm.model_executor.models.deepseek_ocr import DeepseekOCRImagePixelInputs
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

    class FastDeepseekOCR2ForCausalLM(DeepseekOCR2ForCausalLM):
        """DeepSeek-OCR-2 with a batched vision encoder; weights and outputs as the stock class."""

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            graphs = plugin.enabled(name=plugin.GRAPHS_ENV)
            self.ocw_graphs = ViewGraphs(self) if graphs else None
            init_logger("vllm.ocrwatch.deepseek.encoder").info(
                "ocrwatch: fast DeepSeek-OCR-2 vision encoder active (CUDA graphs %s)",
                "on" if graphs else "off",
            )

        def _parse_and_validate_image_input(self, **kwargs: object) -> Any:
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

        def _pixel_values_to_embedding(
            self,
            pixel_values: torch.Tensor,
            images_crop: torch.Tensor | None,
            images_spatial_crop: torch.Tensor,
        ) -> list[torch.Tensor]:
            return pages_to_embeddings(
                self, pixel_values, images_crop, images_spatial_crop, graphs=self.ocw_graphs
            )

    FastDeepseekOCR2ForCausalLM.__module__ = __name__
    FastDeepseekOCR2ForCausalLM.__qualname__ = "FastDeepseekOCR2ForCausalLM"
    return FastDeepseekOCR2ForCausalLM


def __getattr__(name: str) -> type:
    # The class is built on first access: importing this module needs torch but not vLLM (the
    # plugin, ocrwatch.engines.deepseek.plugin, needs neither and only names this module for vLLM to
    # import).
    if name == "FastDeepseekOCR2ForCausalLM":
        cls = _make_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
