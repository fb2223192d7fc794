"""``BatchedNoRepeatNGram`` against vLLM's own ``NGramPerReqLogitsProcessor``, both driven by the
same ``BatchUpdate`` sequence and logits: the same entries must end up ``-inf``. Needs vLLM (skipped
without)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm import SamplingParams
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from ocrwatch.engines.deepseek.ngram_vllm import BatchedNoRepeatNGram
from tests.test_ngram import looping_tokens

VOCAB = 64


def test_batched_processor_bans_exactly_what_vllms_per_request_processor_bans() -> None:
    rng = random.Random(3)
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        model_config=SimpleNamespace(max_model_len=64),
    )
    ours = BatchedNoRepeatNGram(config, torch.device("cpu"), False)
    theirs = NGramPerReqLogitsProcessor(config, torch.device("cpu"), False)
    rows: dict[int, tuple[list[int], list[int]]] = {}
    rules = [
        dict(ngram_size=30, window_size=90, whitelist_token_ids=[3]),
        dict(ngram_size=12, window_size=120),
        dict(ngram_size=4, window_size=16),
        None,
    ]
    compared = 0
    for step in range(400):
        added, removed, moved = [], [], []
        free = [r for r in range(8) if r not in rows]
        if free and (step == 0 or rng.random() < 0.08):
            for row in rng.sample(free, rng.randint(1, len(free))):
                ids: list[int] = []
                rows[row] = (looping_tokens(rng, 600, vocab=rng.choice([3, 9])), ids)
                added.append(
                    (row, SamplingParams(max_tokens=600, extra_args=rng.choice(rules)), None, ids)
                )
        elif len(rows) > 1 and rng.random() < 0.05:
            row = rng.choice(list(rows))
            del rows[row]
            removed.append(row)
        elif len(rows) > 1 and rng.random() < 0.05:
            a, b = rng.sample(list(rows), 2)
            rows[a], rows[b] = rows[b], rows[a]
            moved.append((a, b, MoveDirectionality.SWAP))
        update = (
            BatchUpdate(batch_size=len(rows), removed=removed, added=added, moved=moved)
            if added or removed or moved
            else None
        )
        ours.update_state(update)
        theirs.update_state(update)
        for stream, ids in rows.values():
            ids.append(stream[len(ids)])
        logits = torch.randn(8, VOCAB)
        got = ours.apply(logits.clone())
        want = theirs.apply(logits.clone())
        assert torch.equal(torch.isinf(got), torch.isinf(want)), step
        compared += int(torch.isinf(want).sum())
    assert compared > 200
