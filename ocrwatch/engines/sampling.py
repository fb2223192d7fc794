"""How one attempt at a page decodes, and the defaults of every such setting.

The engine contract (``engines.base``) carries a ``Sampling`` in each ``PageRequest``; the option
models (``engines.deepseek.options``) read their defaults from ``Sampling()``, so each default is
written once, here. It is a module of its own, importing nothing, because those option models sit at
the bottom of the layers (``config`` composes them) and the rest of the contract sits above the
renderer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """One rung of the page retry ladder: greedy decoding with DeepSeek-OCR's no-repeat n-gram guard
    by default (``ngram_size`` or ``window_size`` 0: no guard). Only the ladder sets them per
    attempt; an engine uses what it is given.

    ``stop_pattern`` and ``stop_count`` end an attempt whose output ends in a pattern of at most
    ``stop_pattern`` tokens repeated ``stop_count`` times (vLLM's ``repetition_detection``, checked
    by its scheduler, so no logits processor is needed); 0: never. ``repetition_penalty`` is vLLM's
    built-in one (1.0: none), for the rungs that re-read a page that looped."""

    temperature: float = 0.0
    ngram_size: int = 30
    window_size: int = 90
    max_tokens: int = 4096
    repetition_penalty: float = 1.0
    stop_pattern: int = 0
    stop_count: int = 0
