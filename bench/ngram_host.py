"""The n-gram guard's host rule alone: milliseconds a decode step of ``NGramBans.bans``, which
vLLM's V1 runner calls on every step while the GPU waits, so its time is on every page's critical
path. No vLLM, no GPU.

Each of ``--rows`` requests starts with ``--start`` output tokens; every step appends one token to
each and asks for the bans. ``--vocab`` sets how repetitive the text is: 1 is a request repeating
one token (every window position a candidate), large is text with few repeats. Prints one JSON line
per vocabulary: the minimum over ``--runs`` runs of ``--steps`` steps, and how many bans were found.

    python bench/ngram_host.py [--rows 256] [--vocab 120000,200,20,1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import emit, machine

from ocrwatch.engines.deepseek.ngram import NGramBans, NGramRule


def run(
    rows: int, vocab: int, steps: int, start: int, max_len: int, rule: NGramRule, seed: int
) -> tuple[float, int]:
    """Seconds a step and bans found, one run with fresh requests."""
    rng = np.random.default_rng(seed)
    bans = NGramBans(rows, max_len)
    outputs = [[int(t) for t in rng.integers(0, vocab, start)] for _ in range(rows)]
    for row, ids in enumerate(outputs):
        bans.add(row, rule, ids)
    tokens = rng.integers(0, vocab, (steps, rows)).tolist()
    bans.bans()
    found = 0
    began = time.perf_counter()
    for step in range(steps):
        for ids, token in zip(outputs, tokens[step], strict=True):
            ids.append(token)
        found += len(bans.bans()[0])
    return (time.perf_counter() - began) / steps, found


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=256, help="requests in the batch (max_num_seqs)")
    ap.add_argument(
        "--vocab",
        default="120000,200,20,1",
        help="token ids drawn from 0..VOCAB-1, comma-separated",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--start",
        type=int,
        default=400,
        help="output tokens each request has before the first step",
    )
    ap.add_argument(
        "--max-len", type=int, default=8192, help="vLLM's max_model_len, as the processor is built"
    )
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    # DeepSeek-OCR's, two exempt ids
    rule = NGramRule(ngram_size=30, window_size=90, whitelist=frozenset({1, 2}))
    for vocab in (int(v) for v in a.vocab.split(",")):
        results = [
            run(a.rows, vocab, a.steps, a.start, a.max_len, rule, seed) for seed in range(a.runs)
        ]
        emit(
            {
                "benchmark": "ngram_host",
                "rows": a.rows,
                "vocab": vocab,
                "steps": a.steps,
                "ms_per_step": round(1e3 * min(seconds for seconds, _ in results), 3),
                "bans": results[0][1],
                "machine": machine(),
            }
        )


if __name__ == "__main__":
    main()
