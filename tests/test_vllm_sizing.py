"""The automatic ``max_num_seqs`` / ``max_num_batched_tokens`` rule (``engines.deepseek.sizing``),
pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocrwatch.engines.deepseek import sizing
from ocrwatch.engines.deepseek.arguments import engine_sizing
from ocrwatch.engines.deepseek.geometry import OCR1, OCR2
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.deepseek.platform import Platform

MIB = 2**20
H200 = 143771 * MIB  # NVML's total on the lent H200
H100 = 81559 * MIB
L4 = 23034 * MIB


def test_image_tokens_of_the_largest_page_match_vllms_count() -> None:
    """vLLM's ``get_num_image_tokens``: DeepSeek-OCR-2 256 + 6 × 144 + 1; DeepSeek-OCR 16 × 17 + 60
    × 11 + 1."""
    assert OCR2.max_image_tokens() == 1121
    assert OCR1.max_image_tokens() == 933


def test_the_published_decoder_weighs_about_three_billion_parameters_and_60_kib_of_kv_a_token() -> (
    None
):
    facts = sizing.model_facts(None, OCR2.max_image_tokens())
    assert facts.kv_bytes_per_token == 2 * 12 * 10 * 128 * 2
    assert 6.0 * 2**30 < facts.weight_bytes < 7.0 * 2**30
    assert facts.max_prompt_tokens == 1121 + sizing.PROMPT_TEXT_TOKENS


@pytest.mark.parametrize("max_tokens", [4096, 1000])
def test_an_h200_with_deepseek_ocr_2_gets_the_measured_fast_settings(max_tokens: int) -> None:
    facts = sizing.model_facts(None, OCR2.max_image_tokens())
    got = sizing.resolve(
        max_num_seqs=None,
        max_num_batched_tokens=None,
        gpu_bytes=H200,
        utilization=0.9,
        facts=facts,
        max_tokens=max_tokens,
        max_model_len=8192,
    )
    assert (got.max_num_seqs, got.max_num_batched_tokens, got.source) == (256, 32768, "auto")


def test_smaller_gpus_get_fewer_sequences_and_a_smaller_token_budget() -> None:
    facts = sizing.model_facts(None, OCR2.max_image_tokens())
    h100 = sizing.auto_seqs(H100, 0.9, facts, 4096, 8192, 1)
    l4 = sizing.auto_seqs(L4, 0.9, facts, 4096, 8192, 1)
    assert (h100, sizing.auto_batched_tokens(h100)) == (184, 23552)
    assert (l4, sizing.auto_batched_tokens(l4)) == (16, 8192)
    assert sizing.auto_seqs(16 * 2**30, 0.9, facts, 4096, 8192, 1) == sizing.MIN_SEQS
    # half the memory per GPU for weights and KV cache with tensor parallelism: more sequences fit
    assert sizing.auto_seqs(L4, 0.9, facts, 4096, 8192, 2) > l4
    # a shorter output limit, or a shorter max_model_len, leaves room for more sequences
    assert sizing.auto_seqs(L4, 0.9, facts, 1000, 8192, 1) > l4
    assert sizing.auto_seqs(L4, 0.9, facts, 4096, 2048, 1) > l4


def test_explicit_values_win_and_an_unknown_gpu_falls_back() -> None:
    facts = sizing.model_facts(None, OCR2.max_image_tokens())
    common = dict(utilization=0.9, facts=facts, max_tokens=4096, max_model_len=8192)
    assert sizing.resolve(
        max_num_seqs=64, max_num_batched_tokens=4096, gpu_bytes=H200, **common
    ) == sizing.Sizing(64, 4096, "config")
    assert sizing.resolve(
        max_num_seqs=64, max_num_batched_tokens=None, gpu_bytes=H200, **common
    ) == sizing.Sizing(64, 8192, "mixed")
    assert sizing.resolve(
        max_num_seqs=None, max_num_batched_tokens=16384, gpu_bytes=H200, **common
    ) == sizing.Sizing(256, 16384, "mixed")
    assert sizing.resolve(
        max_num_seqs=None, max_num_batched_tokens=None, gpu_bytes=None, **common
    ) == sizing.Sizing(sizing.FALLBACK_SEQS, 16384, "fallback")


def test_the_engine_reads_the_decoder_from_a_local_config_json(tmp_path: Path) -> None:
    """DeepSeek-OCR with a decoder twice as deep: twice the KV bytes a token, fewer sequences."""
    config = {
        "architectures": ["DeepseekOCRForCausalLM"],
        "language_config": {"num_hidden_layers": 24},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    deep = engine_sizing(VllmConfig(model=str(tmp_path)), Platform("cuda", H100, 1))
    published = engine_sizing(
        VllmConfig(model="deepseek-ai/DeepSeek-OCR"), Platform("cuda", H100, 1)
    )
    assert deep.source == published.source == "auto"
    assert deep.max_num_seqs < published.max_num_seqs
    ocr2 = VllmConfig(model="deepseek-ai/DeepSeek-OCR-2")
    assert engine_sizing(ocr2, Platform("cuda", H200, 1)).max_num_seqs == 256
