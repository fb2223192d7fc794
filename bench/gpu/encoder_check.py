"""Prove ocrwatch's batched DeepSeek-OCR-2 vision encoder equal to vLLM's own, then time both.

Builds the vision tower exactly as vLLM's DeepseekOCR2ForCausalLM does (SAM ViT-B, the Qwen2
decoder-as-encoder, the linear projector, the view separator), fills it with random weights of
realistic scale (rel-pos tables included, so the bias matters), prepares real pages with vLLM's
own DeepseekOCRProcessor (v2: 1024 global view + 768 tiles), and compares, per page:

- stock bf16 vs an fp32 reference of the stock path (what bf16 costs anyway);
- fast bf16 (eager, and replayed as CUDA graphs with --graphs) vs the same reference;
- fast vs stock, and the registered class's own entry point (parse, process, batched path) vs stock.

A page passes when it is finite and within 1.5x the stock path's own bf16 error (+2e-3) of the
reference. Then times the stock per-page loop against the batched path (median of --reps,
CUDA-synchronised), and with --profile writes torch-profiler tables of both. Prints one line per
check and timing, and ends with ``RESULT {json}`` (appended to --out as well).

The checked pages are first the page geometries that take different paths through the encoder
(``GEOMETRIES``: no tiles, the tile size itself, the fewest tiles, the most tiles, a landscape page,
a page at the renderer's size limit; synthetic, seeded), then --pages corpus pages. Exits 1 if any
page of any variant fails.

  python3 bench/gpu/encoder_check.py --model .gpu/dsocr2 --pdfs .gpu/corpus/docs --pages 12
  (CPU smoke test: --device cpu --dtype float32 --pages 1 --no-ref --no-bench)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for ocrwatch
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ocrwatch.engines.deepseek import encoder as fast

PROMPT = "<image>\n<|grounding|>Convert the document to markdown."
GEOMETRIES = {  # (width, height) -> DeepSeek-OCR-2's tile grid (vLLM's processor, 768 tiles)
    "small_no_tiles": (640, 480),  # global view only
    "tile_size": (768, 768),  # the largest image without tiles
    "fewest_tiles": (1600, 800),  # 2 x 1
    "max_tiles_portrait": (1629, 2304),  # A4 at the render cap: 2 x 3 = 6 tiles, the most
    "max_tiles_strip": (768, 4600),  # 1 x 6
    "landscape": (2304, 1629),  # 3 x 2
    "size_limit": (4096, 2896),  # [render] max_side = 4096, landscape A4
}


def synthetic_page(size: tuple[int, int], seed: int):
    """A page of dark text-like strokes on white, seeded: real structure at every scale, never
    zeros."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    w, h = size
    line = max(12, h // 60)
    for y in range(line, h - line, int(line * 1.6)):
        x = int(rng.integers(10, max(11, w // 10)))
        while x < w - 20:
            word = int(rng.integers(line, 6 * line))
            shade = tuple(int(v) for v in rng.integers(0, 90, 3))
            draw.rectangle([x, y, min(w - 10, x + word), y + line], fill=shade)
            x += word + int(rng.integers(line // 2, 2 * line))
    return img


def build_tower(model_dir: str, device: str, dtype: torch.dtype, seed: int):
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.deepencoder import ImageEncoderViT
    from vllm.model_executor.models.deepencoder2 import build_qwen2_decoder_as_encoder
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM
    from vllm.model_executor.models.deepseek_vl2 import MlpProjector
    from vllm.transformers_utils.configs.deepseek_vl2 import DeepseekVLV2Config

    cfg = DeepseekVLV2Config(**json.loads((Path(model_dir) / "config.json").read_text()))

    class Tower(torch.nn.Module):
        # the stock class's own methods, bound to a module that holds only the vision tower
        _encode_global_features = DeepseekOCR2ForCausalLM._encode_global_features
        _encode_local_features = DeepseekOCR2ForCausalLM._encode_local_features
        _pixel_values_to_embedding = DeepseekOCR2ForCausalLM._pixel_values_to_embedding

        def __init__(self):
            super().__init__()
            self.sam_model = ImageEncoderViT(
                depth=12,
                embed_dim=768,
                img_size=1024,
                mlp_ratio=4,
                norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                num_heads=12,
                patch_size=16,
                qkv_bias=True,
                use_rel_pos=True,
                global_attn_indexes=[2, 5, 8, 11],
                window_size=14,
                out_chans=256,
                last_conv_output=896,
            )
            self.qwen2_model = build_qwen2_decoder_as_encoder()
            self.projector = MlpProjector(cfg.projector_config)
            n_embed = cfg.projector_config.n_embed
            self.view_seperator = torch.nn.Parameter(torch.randn(n_embed) / math.sqrt(n_embed))

    vcfg = VllmConfig(device_config=DeviceConfig(device=device))
    ctx = set_current_vllm_config(vcfg)
    ctx.__enter__()  # custom ops look the config up at forward time too: keep it set
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as vLLM builds models: default dtype + target device, no .to()
    try:
        with torch.device(device):
            tower = Tower()
    finally:
        torch.set_default_dtype(default)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tower.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "rel_pos" in name:
                p.copy_(r * 0.5)
            elif name == "view_seperator" or "pos_embed" in name:
                p.copy_(r * 0.02)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * r if name.endswith("weight") else 0.02 * r)
            else:
                p.copy_(r / math.sqrt(p[0].numel()))
    return tower.eval()


def prepare(model_dir: str, images, device: str, dtype: torch.dtype):
    """vLLM's processor, as the engine runs it: pixel_values (n,3,1024,1024), images_crop (tiles),
    images_spatial_crop (n,2)."""
    from transformers import AutoTokenizer
    from vllm.transformers_utils.processors.deepseek_ocr import DeepseekOCRProcessor

    tok = AutoTokenizer.from_pretrained(model_dir)
    proc = DeepseekOCRProcessor(tok, image_size=768, base_size=1024, strategy="v2")
    pv, crops, spatial, ntok = [], [], [], []
    for img in images:
        out = proc(prompt=PROMPT, images=[img])
        pv.append(out["pixel_values"])
        w, h = out["images_spatial_crop"][0].tolist()
        spatial.append(out["images_spatial_crop"])
        if w > 1 or h > 1:
            crops.append(out["images_crop"].reshape(-1, 3, 768, 768))
        ntok.append(int(out["input_ids"].shape[-1]))
    pixel_values = torch.cat(pv).to(device=device, dtype=dtype)
    images_crop = (torch.cat(crops) if crops else torch.zeros(0, 3, 768, 768)).to(
        device=device, dtype=dtype
    )
    images_spatial_crop = torch.cat(spatial).to(device=device, dtype=torch.long)
    return pixel_values, images_crop, images_spatial_crop, ntok


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def flops_per_page(spatial) -> float:
    """Matrix FLOPs of SAM + Qwen2 + projector for one page (global view + its tiles)."""
    sam_layer = 4 * 768 * 768 + 2 * 768 * 3072  # qkv, proj, mlp weights
    qwen_layer = 896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864  # q,o + k,v (GQA 2x64) + mlp

    def view(tokens: int, side: int, n_query: int) -> float:
        f = 2 * tokens * sam_layer * 12
        f += 4 * 4 * tokens * tokens * 768  # 4 global-attention layers (QK and PV)
        f += 8 * 4 * tokens * 196 * 768  # 8 windowed layers
        f += 2 * (2 * n_query) * qwen_layer * 24 + 4 * 24 * (2 * n_query) ** 2 * 896
        return f

    w, h = spatial
    f = view(4096, 64, 256)
    if w > 1 or h > 1:
        f += w * h * view(2304, 48, 144)
    return f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".gpu/dsocr2")
    ap.add_argument("--pdfs", default=".gpu/corpus/docs")
    ap.add_argument("--pages", type=int, default=12)
    ap.add_argument("--bench-pages", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-ref", action="store_true", help="skip the fp32 reference")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--profile", default=None, help="directory for torch-profiler tables")
    ap.add_argument("--out", default=None, help="append a JSON result line here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="also check and time the encoder replayed as CUDA graphs",
    )
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    res: dict = dict(
        device=torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
        torch=torch.__version__,
        dtype=a.dtype,
    )

    import pages as pagelib

    pdfs = pagelib.pdf_files([a.pdfs]) if Path(a.pdfs).exists() else []
    images = pagelib.render(pdfs, 144) if pdfs else []
    # a spread of real geometries: A4, letter, landscape, small, huge
    by_size: dict = {}
    for im in images:
        by_size.setdefault(im.size, []).append(im)
    pick = [v[0] for v in by_size.values()]
    pick += [im for im in images if im not in pick]
    synthetic = [synthetic_page(size, a.seed + i) for i, size in enumerate(GEOMETRIES.values())]
    check_imgs = synthetic + pick[: a.pages]
    images = images or synthetic
    res["check_names"] = list(GEOMETRIES) + [
        f"corpus{i}" for i in range(len(check_imgs) - len(synthetic))
    ]
    res["check_sizes"] = [im.size for im in check_imgs]
    print(f"pages for the check: {res['check_sizes']}", flush=True)

    tower = build_tower(a.model, a.device, dtype, a.seed)
    pv, crops, spatial, ntok = prepare(a.model, check_imgs, a.device, dtype)
    res["prompt_tokens"] = ntok
    res["tiles"] = spatial.tolist()

    with torch.inference_mode():
        stock = tower._pixel_values_to_embedding(pv, crops, spatial)
        ref = None
        if not a.no_ref:
            tower32 = build_tower(a.model, a.device, torch.float32, a.seed)
            ref = tower32._pixel_values_to_embedding(pv.float(), crops.float(), spatial)
            del tower32
            res["stock_vs_ref32"] = [
                float(f"{rel(s, r):.3g}") for s, r in zip(stock, ref, strict=True)
            ]
        checks = {}
        variants: list[tuple[str, dict]] = [("fast", {})]
        # the same kernels replayed as CUDA graphs, batches padded to the graphs' sizes
        if a.graphs:
            variants.append(("fast+graphs", dict(graphs=fast.ViewGraphs(tower))))
        for name, kw in variants:
            try:
                chunks = {} if "graphs" in kw else dict(global_chunk=8, tile_chunk=24)
                out = fast.pages_to_embeddings(tower, pv, crops, spatial, **kw, **chunks)
            # record and go on: one variant failing must not hide the others
            except Exception as exc:
                checks[name] = dict(error=f"{type(exc).__name__}: {exc}"[:500])
                print(f"{name}: FAILED {exc!r}"[:800], flush=True)
                continue
            assert [o.shape for o in out] == [s.shape for s in stock], (
                name,
                [o.shape for o in out],
            )
            c = dict(
                vs_stock=[float(f"{rel(o, s):.3g}") for o, s in zip(out, stock, strict=True)],
                max_abs_vs_stock=round(
                    max(
                        float((o.float() - s.float()).abs().max())
                        for o, s in zip(out, stock, strict=True)
                    ),
                    5,
                ),
                finite=all(bool(torch.isfinite(o).all()) for o in out),
            )
            if ref is not None:
                c["vs_ref32"] = [float(f"{rel(o, r):.3g}") for o, r in zip(out, ref, strict=True)]
                worst = max(
                    x / max(y, 1e-6)
                    for x, y in zip(c["vs_ref32"], res["stock_vs_ref32"], strict=True)
                )
                c["worst_ratio_to_stock_error"] = round(worst, 3)
                c["pass"] = c["finite"] and all(
                    x <= 1.5 * y + 2e-3
                    for x, y in zip(c["vs_ref32"], res["stock_vs_ref32"], strict=True)
                )
            else:
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                c["pass"] = c["finite"] and max(c["vs_stock"]) < tol
            checks[name] = c
            print(
                f"{name}: pass={c['pass']} vs_stock max {max(c['vs_stock']):.2e}"
                + (
                    f" vs_ref32 max {max(c['vs_ref32']):.2e} (stock "
                    f"{max(res['stock_vs_ref32']):.2e})"
                    if ref is not None
                    else ""
                ),
                flush=True,
            )
        # The registered class's own entry point (parse -> process -> batched path), bound to this
        # tower.
        bound = (
            "_parse_and_validate_image_input",
            "_process_image_input",
            "_pixel_values_to_embedding",
        )
        stock_methods = {m: type(tower).__dict__.get(m) for m in bound}
        try:
            cls = fast.FastDeepseekOCR2ForCausalLM
            tower.vision_config = type("VC", (), {"image_size": 1024})()
            tower.ocw_graphs = None
            for m in bound:
                setattr(type(tower), m, getattr(cls, m))
            inp = tower._parse_and_validate_image_input(
                pixel_values=pv, images_crop=crops, images_spatial_crop=spatial
            )
            out = tower._process_image_input(inp)
            c = dict(vs_stock=[float(f"{rel(o, s):.3g}") for o, s in zip(out, stock, strict=True)])
            c["pass"] = [o.shape for o in out] == [s.shape for s in stock] and max(
                c["vs_stock"]
            ) < (1e-4 if dtype == torch.float32 else 3e-2)
            checks["class"] = c
            print(f"class path: pass={c['pass']} vs_stock max {max(c['vs_stock']):.2e}", flush=True)
        except Exception as exc:
            checks["class"] = dict(error=f"{type(exc).__name__}: {exc}"[:500])
            print(f"class path: FAILED {exc!r}"[:800], flush=True)
        finally:  # put the stock methods back, or the "stock" timing below would time the fast ones
            for m, method in stock_methods.items():
                if method is None:
                    delattr(type(tower), m)
                else:
                    setattr(type(tower), m, method)
        res["checks"] = checks
        del stock, ref

        if not a.no_bench:
            bench_imgs = (images * (a.bench_pages // len(images) + 1))[: a.bench_pages]
            pv, crops, spatial, _ = prepare(a.model, bench_imgs, a.device, dtype)
            n = len(bench_imgs)
            fl = sum(flops_per_page(s) for s in spatial.tolist()) / n
            res["bench_pages"] = n
            res["tflop_per_page"] = round(fl / 1e12, 3)
            timing = {}

            def run_stock():
                return tower._pixel_values_to_embedding(pv, crops, spatial)

            run_stock()  # warm-up
            med, ts = timed(run_stock, a.device, a.reps)
            timing["stock_loop"] = dict(
                ms_per_page=round(1000 * med / n, 2),
                pages_per_s=round(n / med, 1),
                tflops=round(fl * n / med / 1e12, 1),
            )
            print(f"stock per-page loop: {1000 * med / n:.1f} ms/page", flush=True)
            variants = [(name, kw) for name, kw in variants if checks.get(name, {}).get("pass")]
            for name, kw in variants:
                try:
                    t0 = time.perf_counter()
                    fast.pages_to_embeddings(tower, pv, crops, spatial, **kw)  # warm-up / compile
                    sync(a.device)
                    first = time.perf_counter() - t0
                    med, ts = timed(
                        lambda kw=kw: fast.pages_to_embeddings(tower, pv, crops, spatial, **kw),
                        a.device,
                        a.reps,
                    )
                    timing[name] = dict(
                        ms_per_page=round(1000 * med / n, 2),
                        pages_per_s=round(n / med, 1),
                        tflops=round(fl * n / med / 1e12, 1),
                        first_call_s=round(first, 1),
                        spread_ms=[round(1000 * t / n, 2) for t in ts],
                    )
                    print(
                        f"{name}: {1000 * med / n:.2f} ms/page (first call {first:.1f} s)",
                        flush=True,
                    )
                except Exception as exc:
                    timing[name] = dict(error=f"{type(exc).__name__}: {exc}"[:500])
                    print(f"{name}: FAILED {exc!r}"[:800], flush=True)
            res["timing"] = timing
            if a.device.startswith("cuda"):
                res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)

            if a.profile:
                from torch.profiler import ProfilerActivity, profile

                os.makedirs(a.profile, exist_ok=True)
                best = "fast" if "ms_per_page" in timing.get("fast", {}) else None
                small = 4
                pv4, crops4, sp4 = (
                    pv[:small],
                    crops[
                        : int(
                            sum(
                                w * h if (w > 1 or h > 1) else 0
                                for w, h in spatial[:small].tolist()
                            )
                        )
                    ],
                    spatial[:small],
                )
                runs = [("stock", lambda: tower._pixel_values_to_embedding(pv4, crops4, sp4))]
                if best:
                    runs.append((best, lambda: fast.pages_to_embeddings(tower, pv4, crops4, sp4)))
                prof_summary = {}
                for name, fn in runs:
                    acts = [ProfilerActivity.CPU] + (
                        [ProfilerActivity.CUDA] if a.device.startswith("cuda") else []
                    )
                    with profile(activities=acts) as prof:
                        t0 = time.perf_counter()
                        fn()
                        sync(a.device)
                        wall = time.perf_counter() - t0
                    ka = prof.key_averages()
                    table = ka.table(
                        sort_by="self_device_time_total"
                        if a.device.startswith("cuda")
                        else "cpu_time_total",
                        row_limit=30,
                    )
                    Path(a.profile, f"profile_{name}.txt").write_text(table)
                    gpu_us = sum(
                        e.self_device_time_total for e in ka if str(e.device_type).endswith("CUDA")
                    )
                    kernels = sum(e.count for e in ka if str(e.device_type).endswith("CUDA"))
                    prof_summary[name] = dict(
                        pages=small,
                        kernels=kernels,
                        gpu_busy_ms=round(gpu_us / 1000, 1),
                        wall_ms=round(1000 * wall, 1),
                    )
                res["profile_4_pages"] = prof_summary
    failed = [name for name, c in res.get("checks", {}).items() if not c.get("pass")]
    res["all_pass"] = not failed
    if "fast" in res.get("checks", {}) and "vs_ref32" in res["checks"]["fast"]:
        c = res["checks"]["fast"]
        for name, size, grid, err, stock in zip(
            res["check_names"],
            res["check_sizes"],
            res["tiles"],
            c["vs_ref32"],
            res["stock_vs_ref32"],
            strict=True,
        ):
            print(
                f"  {name:20s} {size[0]}x{size[1]} grid {grid}: fast {err:.2e} vs fp32, stock "
                f"{stock:.2e}",
                flush=True,
            )
    print(f"encoder check: {'PASS' if not failed else 'FAIL ' + ', '.join(failed)}", flush=True)
    print("RESULT " + json.dumps(res), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
