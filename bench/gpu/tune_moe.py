"""Tune vLLM's fused-MoE Triton kernel for DeepSeek-OCR's expert shape on the GPU it runs on.

vLLM 0.26 has no tuned tile file for DeepSeek-OCR(-2)'s experts (E=64, N=896, K=1280, top-6, bf16)
on an H200 and says so in every run ("Using default MoE config. Performance might be sub-optimal!").
This times `fused_experts` under `override_config` for every candidate tile configuration and token
count M, keeps the fastest per M and writes vLLM's own file format
(`E=..,N=..,device_name=...json`), which vLLM reads from `VLLM_TUNED_CONFIG_FOLDER`. It prints the
default configuration's time beside the best for each M, so the gain per decode step (12 MoE layers
at M = sequences in flight) can be read off before anything is shipped.

    python bench/gpu/tune_moe.py --model .gpu/dsocr2 --out /tmp/moe-configs [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from functools import partial
from pathlib import Path

import torch

# Decode sizes first (the benchmarks keep ~220-256 sequences in flight), then prefill chunks: a
# budget that runs out leaves vLLM's default in place for the token counts that matter least.
DECODE_AND_PREFILL_M = (
    256,
    192,
    128,
    384,
    64,
    512,
    32768,
    16384,
    8192,
    1024,
    2048,
    4096,
    96,
    32,
    16,
    8,
    1,
)


def expert_shape(model_dir: str) -> dict[str, int]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    lang = cfg.get("language_config", cfg)
    return dict(
        E=lang["n_routed_experts"],
        N=lang["moe_intermediate_size"],
        K=lang["hidden_size"],
        topk=lang["num_experts_per_tok"],
        layers=lang["num_hidden_layers"],
    )


def candidates(quick: bool) -> list[dict[str, int]]:
    space = dict(
        BLOCK_SIZE_M=(16, 32, 64, 128),
        BLOCK_SIZE_N=(64, 128, 256),
        BLOCK_SIZE_K=(64, 128),
        GROUP_SIZE_M=(1, 16),
        num_warps=(4, 8),
        num_stages=(3, 4),
    )
    if quick:
        space.update(BLOCK_SIZE_N=(64, 128), GROUP_SIZE_M=(1,), num_stages=(3,))
    keys = list(space)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*space.values())]


def time_call(fn, reps: int) -> float:
    """Microseconds per call: warm-up (compiles the Triton kernel), then CUDA events over `reps`
    calls."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return 1000 * start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".gpu/dsocr2")
    ap.add_argument(
        "--out", required=True, help="folder for the tuned file (VLLM_TUNED_CONFIG_FOLDER)"
    )
    ap.add_argument("--m", default=",".join(map(str, DECODE_AND_PREFILL_M)))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--quick", action="store_true", help="a smaller search space (32 configurations)"
    )
    ap.add_argument(
        "--budget-s", type=float, default=400, help="stop searching after this many seconds"
    )
    a = ap.parse_args()

    from vllm.model_executor.layers.fused_moe import fused_experts, override_config
    from vllm.model_executor.layers.fused_moe.fused_moe import (
        get_config_file_name,
        try_get_optimal_moe_config,
    )

    shape = expert_shape(a.model)
    E, N, K, topk = shape["E"], shape["N"], shape["K"], shape["topk"]
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    w1 = torch.randn(E, 2 * N, K, device=dev, dtype=dtype) / K**0.5
    w2 = torch.randn(E, K, N, device=dev, dtype=dtype) / N**0.5
    ms = [int(m) for m in a.m.split(",")]
    configs = candidates(a.quick)
    print(
        f"shape {shape}; {len(configs)} configurations x {len(ms)} token counts; device "
        f"{torch.cuda.get_device_name()}",
        flush=True,
    )
    t0 = time.time()
    best: dict[int, tuple[float, dict[str, int]]] = {}
    default_us: dict[int, float] = {}
    defaults: dict[int, dict[str, int]] = {}
    for m in ms:
        x = torch.randn(m, K, device=dev, dtype=dtype)
        weights, ids = torch.topk(torch.randn(m, E, device=dev).softmax(-1), topk, dim=-1)
        ids = ids.to(torch.int32)

        call = partial(fused_experts, x, w1, w2, weights, ids)

        default = try_get_optimal_moe_config(w1.shape, w2.shape, topk, None, m)
        defaults[m] = {key: value for key, value in default.items() if key != "SPLIT_K"}
        # discarded: the first timing at each token count reads high (about 2x)
        time_call(call, a.reps)
        default_us[m] = time_call(call, a.reps)
        # a token count the budget leaves untried keeps vLLM's default
        best[m] = (default_us[m], defaults[m])
        for config in configs:
            if time.time() - t0 > a.budget_s:
                break
            # tiles taller than any expert's rows
            if config["BLOCK_SIZE_M"] > max(16, 4 * m * topk // E):
                continue
            # vLLM's context manager has no `finally`: never raise through it
            with override_config(config):
                try:
                    us = time_call(call, a.reps)
                except (
                    Exception
                ) as exc:  # a configuration that does not fit (shared memory, registers)
                    print(f"M={m} {config}: {type(exc).__name__}", flush=True)
                    continue
            if us < best[m][0]:
                best[m] = (us, config)
        print(
            f"M={m}: default {default_us[m]:.1f} us {defaults[m]}; best {best[m][0]:.1f} us "
            f"{best[m][1]} "
            f"({default_us[m] / best[m][0]:.2f}x)",
            flush=True,
        )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / get_config_file_name(E, N, None)
    path.write_text(
        json.dumps({str(m): cfg for m, (_, cfg) in sorted(best.items())}, indent=4) + "\n"
    )
    summary = {
        str(m): dict(default_us=round(default_us[m], 1), best_us=round(best[m][0], 1))
        for m in sorted(best)
    }
    (out / "tune_moe_summary.json").write_text(
        json.dumps(dict(shape=shape, seconds=round(time.time() - t0), by_m=summary), indent=1)
    )
    print(f"wrote {path} after {time.time() - t0:.0f} s", flush=True)
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
