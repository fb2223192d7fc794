"""DeepSeek-OCR's no-repeat-n-gram rule for a whole decode batch at once (NumPy, no vLLM).

vLLM's ``NGramPerReqLogitsProcessor`` runs, for every request on every decode step, a Python loop
over each window position and then one indexing kernel per request that bans something. At 128-256
sequences that is milliseconds of host time per step while the GPU waits. ``NGramBans`` keeps a copy
of each request's output tokens (only the new ones are copied on each step), matches all requests
that share ``(ngram_size, window_size, whitelist)`` in one vectorised comparison and returns every
ban as two index arrays, so the caller touches the logits once.

The rule is vLLM's, exactly: with ``L`` output tokens, ``L >= n``, every n-gram that starts at
``max(0, L - window) <= i <= L - n`` and whose first ``n - 1`` tokens equal the last ``n - 1``
output tokens bans its last token, unless that token is whitelisted. For ``n == 1`` vLLM compares
against the whole output (``ids[-0:]``) and so never bans; ``n < 2`` bans nothing here too.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PLACEHOLDER = -1  # vLLM's async scheduler appends -1 until the sampled token reaches the host


@dataclass(frozen=True)
class NGramRule:
    ngram_size: int
    window_size: int
    whitelist: frozenset[int] = frozenset()

    @classmethod
    def from_extra_args(cls, extra: dict | None) -> NGramRule | None:
        """vLLM's reading of ``SamplingParams.extra_args``: no ``ngram_size``, no rule; window
        default 100."""
        if not extra or extra.get("ngram_size") is None:
            return None
        return cls(
            ngram_size=int(extra["ngram_size"]),
            window_size=int(extra.get("window_size", 100)),
            whitelist=frozenset(int(t) for t in extra.get("whitelist_token_ids") or ()),
        )


class _Row:
    __slots__ = ("rule", "ids", "have")

    def __init__(self, rule: NGramRule, ids: MutableSequence[int]) -> None:
        self.rule, self.ids, self.have = rule, ids, 0


class NGramBans:
    """Per batch row: the rule, a reference to the live output list, and a copy of its tokens so far
    (``_hist``, one row per batch row, so a request's copy moves with it)."""

    def __init__(self, rows: int, max_len: int) -> None:
        self._hist = np.zeros((max(rows, 1), max(max_len, 1)), dtype=np.int64)
        self._rows: dict[int, _Row] = {}
        self._groups: dict[NGramRule, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, row: int, rule: NGramRule | None, output_ids: MutableSequence[int]) -> None:
        self._groups = None
        if rule is None or rule.ngram_size < 2 or rule.window_size < rule.ngram_size:
            self._rows.pop(row, None)
            return
        self._grow(rows=row + 1)
        self._rows[row] = _Row(rule, output_ids)

    def remove(self, row: int) -> None:
        self._groups = None
        self._rows.pop(row, None)

    def move(self, src: int, dst: int, swap: bool) -> None:
        """vLLM's persistent batch moves a request to another row (``swap``: exchanges two rows)."""
        self._groups = None
        a, b = self._rows.pop(src, None), self._rows.pop(dst, None)
        self._grow(rows=max(src, dst) + 1)
        if a is not None:
            self._rows[dst] = a
        if swap and b is not None:
            self._rows[src] = b
        if swap:
            self._hist[[src, dst]] = self._hist[[dst, src]]
        else:
            self._hist[dst] = self._hist[src]

    def bans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, tokens)`` to set to ``-inf``: one entry per banned token (duplicates
        possible)."""
        self._sync()
        if self._groups is None:
            groups: dict[NGramRule, list[int]] = {}
            for index, row in self._rows.items():
                groups.setdefault(row.rule, []).append(index)
            self._groups = {rule: np.asarray(rows, dtype=np.int64) for rule, rows in groups.items()}
        found_rows: list[np.ndarray] = []
        found_tokens: list[np.ndarray] = []
        for rule, rows in self._groups.items():
            lens = np.fromiter(
                (self._rows[r].have for r in rows.tolist()), dtype=np.int64, count=len(rows)
            )
            ready = lens >= rule.ngram_size
            if ready.any():
                r, t = self._group_bans(rule, rows[ready], lens[ready])
                found_rows.append(r)
                found_tokens.append(t)
        if not found_rows:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        return np.concatenate(found_rows), np.concatenate(found_tokens)

    def _group_bans(
        self, rule: NGramRule, rows: np.ndarray, lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n, w = rule.ngram_size, rule.window_size
        pos = lens[:, None] - w + np.arange(w)
        valid = pos >= 0
        window = self._hist[rows[:, None], np.maximum(pos, 0)]
        prefix = window[:, w - n + 1 :]
        starts = sliding_window_view(window, n - 1, axis=1)[:, : w - n + 1]
        following = window[:, n - 1 :]
        # Only n-grams whose (n-1)-th token equals the last output token can match: compare those
        # alone.
        maybe = (window[:, n - 2 : w - 1] == window[:, -1:]) & valid[:, : w - n + 1]
        if rule.whitelist:
            maybe &= ~np.isin(following, np.fromiter(rule.whitelist, dtype=np.int64))
        hit_row, hit_col = np.nonzero(maybe)
        full = (starts[hit_row, hit_col] == prefix[hit_row]).all(axis=1)
        hit_row, hit_col = hit_row[full], hit_col[full]
        return rows[hit_row], following[hit_row, hit_col]

    def _sync(self) -> None:
        """Copy the tokens each output list gained since the last step (usually one); stop at a
        placeholder (re-read once vLLM fills it in); start over if the list got shorter."""
        hist = self._hist
        for index, row in self._rows.items():
            ids, have = row.ids, row.have
            now = len(ids)
            if now == have + 1 and have < hist.shape[1]:
                token = ids[have]
                if token != PLACEHOLDER:
                    hist[index, have] = token
                    row.have = now
                continue
            if now == have:
                continue
            if now < have:
                have = 0
            new = list(ids[have:now])
            if PLACEHOLDER in new:
                new = new[: new.index(PLACEHOLDER)]
            if have + len(new) > hist.shape[1]:
                self._grow(cols=have + len(new))
                hist = self._hist
            hist[index, have : have + len(new)] = new
            row.have = have + len(new)

    def _grow(self, rows: int = 0, cols: int = 0) -> None:
        r, c = self._hist.shape
        if rows <= r and cols <= c:
            return
        hist = np.zeros((max(r, rows), max(2 * c, cols) if cols > c else c), dtype=np.int64)
        hist[:r, :c] = self._hist
        self._hist = hist
