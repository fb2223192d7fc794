"""The n-gram guard's host cost per decode step, on the device: vLLM's ``NGramPerReqLogitsProcessor``
against ocrwatch's ``BatchedNoRepeatNGram``, both fed the same ``BatchUpdate`` and the same CUDA logits
(rows x 129,280 fp32, as the engine holds them), with looping token streams like a random-weight model's.
Checks at every step that both leave exactly the same entries at -inf; prints one ``RESULT {json}`` line.

  python3 bench/gpu/ngram_bench.py --rows 128,256 --steps 300
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import BatchUpdate

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from ocrwatch.engines.deepseek.ngram_vllm import BatchedNoRepeatNGram  # noqa: E402
from test_ngram import looping_tokens  # noqa: E402

VOCAB = 129280
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RULE = dict(ngram_size=30, window_size=90, whitelist_token_ids=[128821, 128822])


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def run(rows: int, steps: int, warm: int) -> dict:
    rng = random.Random(rows)
    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=rows), model_config=SimpleNamespace(max_model_len=8192))
    procs = {"per_request": NGramPerReqLogitsProcessor(cfg, DEVICE, True),
             "batched": BatchedNoRepeatNGram(cfg, DEVICE, True)}
    streams = [looping_tokens(rng, warm + steps + 1, vocab=rng.choice([50, 400, 5000])) for _ in range(rows)]
    lists = [s[:warm] for s in streams]
    update = BatchUpdate(batch_size=rows, removed=[], moved=[],
                         added=[(i, SamplingParams(max_tokens=8192, extra_args=RULE), None, lists[i]) for i in range(rows)])
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
    return dict(rows=rows, steps=steps, bans=bans, equal=True,
                **{f"{k}_ms_per_step": round(1000 * v / steps, 3) for k, v in spent.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=200, help="output tokens each request has before timing")
    a = ap.parse_args()
    res = [run(int(r), a.steps, a.warm) for r in a.rows.split(",")]
    for r in res:
        print(f"[ngram] rows={r['rows']}: per_request {r['per_request_ms_per_step']} ms/step, "
              f"batched {r['batched_ms_per_step']} ms/step, equal over {r['steps']} steps ({r['bans']} bans)", flush=True)
    print("RESULT " + json.dumps(dict(label="ngram", results=res)), flush=True)


if __name__ == "__main__":
    main()
