"""The batched n-gram ban against vLLM's per-request rule (transcribed below), on looping token
streams like the ones a repeating model produces, through the batch changes vLLM's persistent batch
makes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ocrwatch.engines.deepseek.ngram import PLACEHOLDER, NGramBans, NGramRule


def reference_bans(ids: list[int], n: int, window: int, whitelist: frozenset[int]) -> set[int]:
    """vLLM 0.26 ``NoRepeatNGramLogitsProcessor.__call__``, returning the banned set."""
    if len(ids) < n:
        return set()
    prefix = tuple(ids[-(n - 1) :])
    banned = set()
    for i in range(max(0, len(ids) - window), len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        if gram[:-1] == prefix:
            banned.add(gram[-1])
    return banned - whitelist


def looping_tokens(rng: random.Random, length: int, vocab: int = 12) -> list[int]:
    """Random text that falls into loops of random period now and then, as random-weight models
    do."""
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < 0.5:
            period = rng.randint(1, min(15, len(out)))
            out.extend(out[-period:] * rng.randint(1, 6))
        else:
            out.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 8)))
    return out[:length]


def as_sets(rows: np.ndarray, tokens: np.ndarray) -> dict[int, set[int]]:
    found: dict[int, set[int]] = {}
    for r, t in zip(rows.tolist(), tokens.tolist(), strict=True):
        found.setdefault(r, set()).add(t)
    return found


RULES = [
    NGramRule(30, 90, frozenset({3, 4})),
    NGramRule(20, 90),
    NGramRule(12, 120, frozenset({7})),
    NGramRule(3, 10),
    NGramRule(2, 2),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"n{r.ngram_size}w{r.window_size}")
def test_every_step_bans_what_the_per_request_rule_bans(rule: NGramRule) -> None:
    rng = random.Random(rule.ngram_size * 1000 + rule.window_size)
    streams = [looping_tokens(rng, 400, vocab=rng.choice([3, 6, 40])) for _ in range(6)]
    lists: list[list[int]] = [[] for _ in streams]
    bans = NGramBans(rows=4, max_len=16)  # both grow on demand
    for row, ids in enumerate(lists):
        bans.add(row, rule, ids)
    banned_somewhere = 0
    for step in range(400):
        for row, stream in enumerate(streams):
            lists[row].append(stream[step])
        got = as_sets(*bans.bans())
        for row, ids in enumerate(lists):
            want = reference_bans(ids, rule.ngram_size, rule.window_size, rule.whitelist)
            assert got.get(row, set()) == want, (row, step)
            banned_somewhere += bool(want)
    assert banned_somewhere > 100  # the streams do loop, so the comparison is not vacuous


def test_rules_mixed_in_one_batch_follow_rows_through_moves_swaps_and_removals() -> None:
    rng = random.Random(7)
    bans = NGramBans(rows=8, max_len=64)
    live: dict[int, tuple[NGramRule, list[int], list[int]]] = {}

    def add(row: int) -> None:
        rule = rng.choice(RULES)
        stream = looping_tokens(rng, 600, vocab=rng.choice([3, 8]))
        ids: list[int] = []
        live[row] = (rule, stream, ids)
        bans.add(row, rule, ids)

    for row in range(8):
        add(row)
    for step in range(300):
        op = rng.random()
        if op < 0.05 and live:
            row = rng.choice(list(live))
            del live[row]
            bans.remove(row)
        elif op < 0.10:
            add(rng.choice([r for r in range(10) if r not in live] or [0]))
        elif op < 0.15 and len(live) >= 2:
            a, b = rng.sample(list(live), 2)
            live[a], live[b] = live[b], live[a]
            bans.move(a, b, swap=True)
        elif op < 0.20 and live:
            src = rng.choice(list(live))
            dst = rng.choice([r for r in range(10) if r != src])
            live[dst] = live.pop(src)
            bans.move(src, dst, swap=False)
        for _, stream, ids in live.values():
            ids.append(stream[len(ids)])
        got = as_sets(*bans.bans())
        for row, (rule, _, ids) in live.items():
            assert got.get(row, set()) == reference_bans(
                ids, rule.ngram_size, rule.window_size, rule.whitelist
            )
        assert set(got) <= set(live), step


def test_placeholders_are_read_again_once_filled_and_a_shorter_list_is_read_afresh() -> None:
    rule = NGramRule(3, 10)
    ids = [1, 2, 9, 1, 2]
    bans = NGramBans(rows=1, max_len=8)
    bans.add(0, rule, ids)
    assert as_sets(*bans.bans()) == {0: {9}}
    ids.append(PLACEHOLDER)  # async scheduling: the sampled token is not on the host yet
    assert as_sets(*bans.bans()) == {0: {9}}
    ids[-1] = 5
    ids.extend([1, 2])
    assert as_sets(*bans.bans()) == {0: {9, 5}}
    del ids[2:]  # tokens discarded: the copy starts over
    ids.extend([7, 1, 2])
    assert as_sets(*bans.bans()) == {0: {7}}


@pytest.mark.parametrize(
    "extra", [None, {}, {"window_size": 5}, {"ngram_size": 1}, {"ngram_size": 9, "window_size": 4}]
)
def test_requests_without_a_usable_rule_are_not_tracked(extra: dict | None) -> None:
    bans = NGramBans(rows=2, max_len=8)
    bans.add(0, NGramRule.from_extra_args(extra), [1, 1, 1, 1, 1, 1, 1, 1, 1])
    assert len(bans) == 0
    assert bans.bans()[0].size == 0


def test_extra_args_are_read_as_vllm_reads_them() -> None:
    rule = NGramRule.from_extra_args({"ngram_size": 30, "whitelist_token_ids": [128821, 128822]})
    assert rule == NGramRule(30, 100, frozenset({128821, 128822}))
