"""vLLM batch-level logits processor for DeepSeek-OCR's no-repeat-n-gram rule (``[engine.vllm]
ngram_processor = "batched"``), loaded by name in vLLM's engine core.

It reads the same ``SamplingParams.extra_args`` as vLLM's ``NGramPerReqLogitsProcessor`` and bans
the same tokens (``ngram``), but does the whole batch in one NumPy pass and one indexing call on the
logits instead of a Python loop and a kernel per request. Imports vLLM, so only the engine names it.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ocrwatch.engines.deepseek.ngram import NGramBans, NGramRule


class BatchedNoRepeatNGram(LogitsProcessor):
    validate_params = NGramPerReqLogitsProcessor.validate_params

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._bans = NGramBans(
            rows=vllm_config.scheduler_config.max_num_seqs,
            max_len=vllm_config.model_config.max_model_len,
        )
        self._pin = is_pin_memory

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """The order of vLLM's own adapter (``process_dict_updates``): added, removed, moved."""
        if not batch_update:
            return
        for index, params, _, output_ids in batch_update.added:
            self._bans.add(index, NGramRule.from_extra_args(params.extra_args), output_ids)
        for index in batch_update.removed:
            self._bans.remove(index)
        for src, dst, direction in batch_update.moved:
            self._bans.move(src, dst, swap=direction == MoveDirectionality.SWAP)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not len(self._bans):
            return logits
        rows, tokens = self._bans.bans()
        if rows.size:
            logits[tuple(self._to_device(np.stack((rows, tokens)), logits.device))] = float("-inf")
        return logits

    def _to_device(self, index: np.ndarray, device: torch.device) -> torch.Tensor:
        """The ban indices on the logits' device without waiting for the GPU: a copy from pageable
        memory synchronises the stream, which made every decode step wait for its own forward pass
        before the host could go on (seen in a py-spy dump of the engine core). From pinned memory
        the copy is queued behind the forward pass; torch keeps the pinned block until the copy has
        run."""
        host = torch.from_numpy(index)
        if self._pin and device.type == "cuda":
            return host.pin_memory().to(device, non_blocking=True)
        return host.to(device)
