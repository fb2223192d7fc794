"""DeepSeek-OCR's no-repeat-n-gram rule inside vLLM's V2 model runner, as one kernel on the GPU
(``[engine.vllm] ngram_processor = "gpu"``).

vLLM 0.26-0.30 refuse custom logits processors on their V2 model runner (a model then runs on the V1
runner), so a guard for V2 must live inside its sampler. (vLLM 0.26 runs DeepSeek-OCR and
DeepSeek-OCR-2 on V1 anyway, unless ``VLLM_USE_V2_MODEL_RUNNER=1``: they are mixtures of experts
outside its default-V2 list.) The V2 runner keeps every request's tokens on the GPU
(``RequestState.all_token_ids``: the prompt, then the output, with ``prompt_len`` and ``total_len``)
for its own bad-words kernel; this module adds a kernel that reads the same tensors and, for each
row of the logits, sets to ``-inf`` every token that would repeat an n-gram of the window: the rule
of ``ngram.py`` (and of vLLM's ``NGramPerReqLogitsProcessor``), exactly. Its settings come from
``SamplingParams.extra_args``, as that processor's do; nothing runs on the host per step but one
launch.

``install()`` adds it to vLLM's V2 ``Sampler`` (``add_request``, ``apply_staged_writes`` and
``apply_sampling_params``), in vLLM's worker processes, through the plugin (``OCRWATCH_NGRAM_GPU``).
The engine checks that vLLM chose the V2 runner and registers the batched logits processor
otherwise. Speculative decoding is not supported (one logits row per request is assumed).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from vllm.triton_utils import tl, triton
from vllm.v1.worker.gpu.buffer_utils import UvaBackedTensor

from ocrwatch.engines.deepseek.ngram import NGramRule

MAX_WHITELIST = 8
"""Exempt token ids per request (DeepSeek-OCR exempts two: ``<td>`` and ``</td>``)."""


@triton.jit
def _ngram_ban_kernel(
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    ngram_ptr,
    window_ptr,
    whitelist_ptr,
    tokens_ptr,
    tokens_stride,
    prompt_len_ptr,
    total_len_ptr,
    scratch_ptr,
    BLOCK: tl.constexpr,
    MAX_WL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(idx_mapping_ptr + row)
    if slot < 0:
        return
    n = tl.load(ngram_ptr + slot)
    if n < 2:
        return
    w = tl.load(window_ptr + slot)
    prompt_len = tl.load(prompt_len_ptr + slot)
    length = tl.load(total_len_ptr + slot) - prompt_len
    if length < n:
        return
    # The window (the last w output tokens, -1 before the first) goes to a scratch row once: the
    # tokens live in host memory the GPU reads over the bus (vLLM's UVA tensor), and the comparisons
    # below read it n - 1 times.
    offs = tl.arange(0, BLOCK)
    pos = length - w + offs
    inside = (offs < w) & (pos >= 0)
    window = tl.load(
        tokens_ptr + slot.to(tl.int64) * tokens_stride + prompt_len + pos, mask=inside, other=-1
    )
    scratch = scratch_ptr + row * BLOCK
    tl.store(scratch + offs, window)
    tl.debug_barrier()
    # An n-gram starting at window index j (pos >= 0, j <= w - n) whose first n - 1 tokens equal the
    # last n - 1 output tokens (window indexes w - n + 1 .. w - 1) bans the token that followed it.
    match = (offs <= w - n) & (pos >= 0)
    for k in range(0, n - 1):
        candidate = tl.load(scratch + offs + k, mask=match, other=-2)
        last = tl.load(scratch + w - n + 1 + k)
        match = match & (candidate == last)
    follow = tl.load(scratch + offs + n - 1, mask=match, other=0)
    for m in range(0, MAX_WL):
        exempt = tl.load(whitelist_ptr + slot * MAX_WL + m)
        match = match & (follow != exempt)
    tl.store(logits_ptr + row * logits_stride + follow, float("-inf"), mask=match)


class NGramGpuState:
    """Per request slot of the V2 runner: n-gram size (0 = off), window, exempt tokens; staged like
    vLLM's own sampling states and copied to the GPU before each step."""

    def __init__(self, req_states: Any) -> None:
        self.req_states = req_states
        slots = req_states.max_num_reqs
        self.ngram = UvaBackedTensor(slots, dtype=torch.int32)
        self.window = UvaBackedTensor(slots, dtype=torch.int32)
        self.whitelist = UvaBackedTensor((slots, MAX_WHITELIST), dtype=torch.int32)

    def add_request(self, slot: int, sampling_params: Any) -> None:
        rule = NGramRule.from_extra_args(getattr(sampling_params, "extra_args", None))
        if rule is None or rule.ngram_size < 2 or rule.window_size < rule.ngram_size:
            self.ngram.np[slot] = 0
            return
        exempt = sorted(rule.whitelist)
        if len(exempt) > MAX_WHITELIST:
            raise ValueError(f"at most {MAX_WHITELIST} whitelist_token_ids, got {len(exempt)}")
        self.ngram.np[slot] = rule.ngram_size
        self.window.np[slot] = rule.window_size
        self.whitelist.np[slot] = -1
        self.whitelist.np[slot, : len(exempt)] = exempt

    def apply_staged_writes(self) -> None:
        self.ngram.copy_to_uva()
        self.window.copy_to_uva()
        self.whitelist.copy_to_uva()

    def apply(
        self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor, idx_mapping_np: np.ndarray
    ) -> None:
        """Ban in place; no launch when no request of the step has the rule."""
        slots = idx_mapping_np[idx_mapping_np >= 0]
        active = self.ngram.np[slots] > 0
        if not active.any():
            return
        block = max(16, triton.next_power_of_2(int(self.window.np[slots][active].max())))
        rows = logits.shape[0]
        scratch = torch.empty(rows * block, dtype=torch.int32, device=logits.device)
        tokens = self.req_states.all_token_ids.gpu
        _ngram_ban_kernel[(rows,)](
            logits,
            logits.stride(0),
            expanded_idx_mapping,
            self.ngram.gpu,
            self.window.gpu,
            self.whitelist.gpu,
            tokens,
            tokens.stride(0),
            self.req_states.prompt_len.gpu,
            self.req_states.total_len.gpu,
            scratch,
            BLOCK=block,
            MAX_WL=MAX_WHITELIST,
        )


def install() -> None:
    """Add the rule to vLLM's V2 ``Sampler``; idempotent."""
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    if getattr(Sampler, "_ocrwatch_ngram", False):
        return
    init, add, staged, apply = (
        Sampler.__init__,
        Sampler.add_request,
        Sampler.apply_staged_writes,
        Sampler.apply_sampling_params,
    )

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.ocrwatch_ngram = NGramGpuState(self.req_states)
        from vllm.logger import init_logger

        init_logger("vllm.ocrwatch.deepseek.ngram_gpu").info(
            "ocrwatch: n-gram guard in the V2 sampler"
        )

    @functools.wraps(add)
    def add_request(self: Any, req_idx: int, prompt_len: int, sampling_params: Any) -> None:
        add(self, req_idx, prompt_len, sampling_params)
        self.ocrwatch_ngram.add_request(req_idx, sampling_params)

    @functools.wraps(staged)
    def apply_staged_writes(self: Any) -> None:
        staged(self)
        self.ocrwatch_ngram.apply_staged_writes()

    @functools.wraps(apply)
    def apply_sampling_params(
        self: Any,
        logits: torch.Tensor,
        expanded_idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        self.ocrwatch_ngram.apply(logits, expanded_idx_mapping, idx_mapping_np)
        return apply(self, logits, expanded_idx_mapping, idx_mapping_np, *args, **kwargs)

    Sampler.__init__ = __init__  # type: ignore[method-assign]
    Sampler.add_request = add_request  # type: ignore[method-assign]
    Sampler.apply_staged_writes = apply_staged_writes  # type: ignore[method-assign]
    Sampler.apply_sampling_params = apply_sampling_params  # type: ignore[method-assign]
    Sampler._ocrwatch_ngram = True  # type: ignore[attr-defined]
