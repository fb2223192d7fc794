"""The n-gram guard's cost per decode step, on the device: vLLM's ``NGramPerReqLogitsProcessor``
against ocrwatch's ``BatchedNoRepeatNGram``, both fed the same ``BatchUpdate`` and the same CUDA
logits (rows x 129,280 fp32, as the engine holds them), with looping token streams like a
random-weight model's; then (``gpu``) ocrwatch's kernel for vLLM's V2 sampler (``ngram_gpu``)
against ``BatchedNoRepeatNGram``, reading the tokens from a UVA tensor after a prompt as the V2
runner keeps them, with three rules (the ladder's) and rows without one. Checks at every step that
both leave exactly the same entries at -inf (fails otherwise); prints one ``RESULT {json}`` line.

  python3 bench/gpu/ngram_bench.py --rows 128,256 --steps 300 [--only gpu]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from vllm import SamplingParams
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import BatchUpdate

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_ngram import looping_tokens

from ocrwatch.engines.deepseek.ngram_vllm import BatchedNoRepeatNGram

VOCAB = 129280
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RULE = dict(ngram_size=30, window_size=90, whitelist_token_ids=[128821, 128822])


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def run(rows: int, steps: int, warm: int) -> dict:
    rng = random.Random(rows)
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        model_config=SimpleNamespace(max_model_len=8192),
    )
    procs = {
        "per_request": NGramPerReqLogitsProcessor(cfg, DEVICE, True),
        "batched": BatchedNoRepeatNGram(cfg, DEVICE, True),
    }
    streams = [
        looping_tokens(rng, warm + steps + 1, vocab=rng.choice([50, 400, 5000]))
        for _ in range(rows)
    ]
    lists = [s[:warm] for s in streams]
    update = BatchUpdate(
        batch_size=rows,
        removed=[],
        moved=[],
        added=[
            (i, SamplingParams(max_tokens=8192, extra_args=RULE), None, lists[i])
            for i in range(rows)
        ],
    )
    for p in procs.values():
        p.update_state(update)
    spent = {k: 0.0 for k in procs}
    bans = 0
    base = torch.randn(rows, VOCAB, device=DEVICE)
    for step in range(steps):
        for i, ids in enumerate(lists):
            ids.append(streams[i][len(ids)])
        masks = {}
        for name, p in procs.items():
            logits = base.clone()
            sync()
            t0 = time.perf_counter()
            p.update_state(None)
            out = p.apply(logits)
            sync()
            spent[name] += time.perf_counter() - t0
            masks[name] = torch.isinf(out)
        if not torch.equal(masks["batched"], masks["per_request"]):
            raise SystemExit(f"MISMATCH at rows={rows} step={step}")
        bans += int(masks["batched"].sum())
    return dict(
        rows=rows,
        steps=steps,
        bans=bans,
        equal=True,
        **{f"{k}_ms_per_step": round(1000 * v / steps, 3) for k, v in spent.items()},
    )


RULES = [
    RULE,
    dict(ngram_size=20, window_size=90, whitelist_token_ids=[128821, 128822]),
    dict(ngram_size=12, window_size=120, whitelist_token_ids=[128821, 128822]),
    None,
]


def run_gpu(rows: int, steps: int, warm: int, prompt: int = 57) -> dict:
    """``ngram_gpu``'s kernel against ``BatchedNoRepeatNGram`` on the same streams, step by step."""
    from vllm.v1.worker.gpu.buffer_utils import UvaBackedTensor

    from ocrwatch.engines.deepseek.ngram_gpu import NGramGpuState

    rng = random.Random(1000 + rows)
    max_len = prompt + warm + steps + 1
    tokens = UvaBackedTensor((rows, max_len), dtype=torch.int32)
    prompt_len = UvaBackedTensor(rows, dtype=torch.int32)
    prompt_len.np[:] = prompt
    prompt_len.copy_to_uva()
    total = torch.full((rows,), prompt + warm, dtype=torch.int32, device=DEVICE)
    req_states = SimpleNamespace(
        max_num_reqs=rows,
        all_token_ids=tokens,
        prompt_len=prompt_len,
        total_len=SimpleNamespace(gpu=total),
    )
    state = NGramGpuState(req_states)
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        model_config=SimpleNamespace(max_model_len=8192),
    )
    host = BatchedNoRepeatNGram(cfg, DEVICE, True)
    streams = [
        looping_tokens(rng, warm + steps + 1, vocab=rng.choice([50, 400, 5000]))
        for _ in range(rows)
    ]
    # exempt <td> in loops too
    streams = [[128821 if rng.random() < 0.03 else t for t in s] for s in streams]
    lists = [s[:warm] for s in streams]
    rules = [RULES[i % len(RULES)] for i in range(rows)]
    params = [SamplingParams(max_tokens=8192, extra_args=r) for r in rules]
    for i in range(rows):
        tokens.np[i, :prompt] = [rng.randrange(VOCAB) for _ in range(prompt)]
        tokens.np[i, prompt : prompt + warm] = lists[i]
        state.add_request(i, params[i])
    state.apply_staged_writes()
    host.update_state(
        BatchUpdate(
            batch_size=rows,
            removed=[],
            moved=[],
            added=[(i, params[i], None, lists[i]) for i in range(rows)],
        )
    )
    idx = torch.arange(rows, dtype=torch.int32, device=DEVICE)
    idx_np = np.arange(rows, dtype=np.int32)
    base = torch.randn(rows, VOCAB, device=DEVICE)
    spent = {"gpu": 0.0, "batched": 0.0}
    bans = 0
    for step in range(steps):
        for i, ids in enumerate(lists):
            ids.append(streams[i][len(ids)])
            tokens.np[i, prompt + len(ids) - 1] = ids[-1]
        tokens.copy_to_uva()
        total += 1
        state.apply_staged_writes()
        masks = {}
        for name in ("gpu", "batched"):
            logits = base.clone()
            sync()
            t0 = time.perf_counter()
            if name == "gpu":
                state.apply(logits, idx, idx_np)
            else:
                host.update_state(None)
                logits = host.apply(logits)
            sync()
            spent[name] += time.perf_counter() - t0
            masks[name] = torch.isinf(logits)
        if not torch.equal(masks["gpu"], masks["batched"]):
            diff = (masks["gpu"] != masks["batched"]).nonzero()[:5].tolist()
            raise SystemExit(f"GPU MISMATCH at rows={rows} step={step}: {diff}")
        bans += int(masks["gpu"].sum())
    return dict(
        rows=rows,
        steps=steps,
        bans=bans,
        equal=True,
        check="gpu",
        **{f"{k}_ms_per_step": round(1000 * v / steps, 3) for k, v in spent.items()},
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--warm", type=int, default=200, help="output tokens each request has before timing"
    )
    ap.add_argument("--only", choices=("host", "gpu"), default=None)
    a = ap.parse_args()
    res = []
    if a.only != "gpu":
        res += [run(int(r), a.steps, a.warm) for r in a.rows.split(",")]
    if a.only != "host":
        res += [run_gpu(int(r), a.steps, a.warm) for r in a.rows.split(",")]
    for r in res:
        times = ", ".join(
            f"{k[:-12]} {v} ms/step" for k, v in r.items() if k.endswith("_ms_per_step")
        )
        print(
            f"[ngram] rows={r['rows']}: {times}, equal over {r['steps']} steps ({r['bans']} bans)",
            flush=True,
        )
    print("RESULT " + json.dumps(dict(label="ngram", results=res)), flush=True)


if __name__ == "__main__":
    main()
