"""The official DeepSeek-OCR-2 script's shape on one GPU: render every page first (144 DPI),
then one ``LLM.generate()`` over all of them; stock vLLM class or ocrwatch's fast encoder (--fast).

One engine per process; one generate() per --max-tokens value on the same engine (e.g. 1000 then 1:
with one output token a page the run is input preparation + vision encoder + prefill only).
Random weights (load_format="dummy"), so the output length is forced: ignore_eos=True.

  python3 bench/gpu/engine_bench.py --label script --pdfs .gpu/corpus/docs \\
      --repeat 3 --max-tokens 1000,1
  python3 bench/gpu/engine_bench.py --label engine --fast --ngram batched ...

Prints one line per generate() call and one ``RESULT {json}`` line (also appended to --out): pages/s
and output tokens/s of each call (rendering not counted), prompt tokens, engine start, one thread's
input preparation per page, GPU memory (NVML) and host RSS at start and end, and wall-clock phase
bounds (to line up with nvidia-smi dmon).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

PROMPT = "<image>\n<|grounding|>Convert the document to markdown."


class Monitor(threading.Thread):
    """GPU memory peak (NVML) and host RSS of this process and its children (psutil)."""

    def __init__(self):
        super().__init__(daemon=True)
        import psutil
        import pynvml

        pynvml.nvmlInit()
        from e2e import visible_gpus

        first = (visible_gpus() or [0])[0]
        self.nvml, self.h, self.ps = pynvml, pynvml.nvmlDeviceGetHandleByIndex(first), psutil
        self.peak, self.stop = 0, False

    def gpu_used(self) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.h).used

    def rss(self) -> int:
        me = self.ps.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            with contextlib.suppress(self.ps.Error):
                total += child.memory_info().rss
        return total

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, self.gpu_used())
            time.sleep(0.2)


def gib(x: float) -> float:
    return round(x / 2**30, 2)


def measure_input_prep(model: str, images, n: int = 24) -> dict:
    """vLLM's DeepSeek-OCR processor alone, one thread: the CPU cost of turning a page into model
    input."""
    from transformers import AutoTokenizer
    from vllm.transformers_utils.processors.deepseek_ocr import DeepseekOCRProcessor

    proc = DeepseekOCRProcessor(
        AutoTokenizer.from_pretrained(model), image_size=768, base_size=1024, strategy="v2"
    )
    proc(prompt=PROMPT, images=[images[0]])
    t0 = time.perf_counter()
    for im in images[:n]:
        proc(prompt=PROMPT, images=[im])
    return dict(
        pages=min(n, len(images)),
        ms_per_page=round(1000 * (time.perf_counter() - t0) / min(n, len(images)), 1),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--model", default=str(HERE.parents[1] / ".gpu/dsocr2"))
    ap.add_argument("--pdfs", default=str(HERE.parents[1] / ".gpu/corpus/docs"))
    ap.add_argument("--repeat", type=int, default=3, help="use every page this many times")
    ap.add_argument("--dpi", type=int, default=144)
    ap.add_argument("--max-tokens", default="1000,1")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument(
        "--ngram",
        choices=("batched", "per_request", "none"),
        default="per_request",
        help="n-gram guard: ocrwatch's batched processor, vLLM's per-request one (the official "
        "script's), or none",
    )
    ap.add_argument(
        "--fast", action="store_true", help="ocrwatch's batched vision encoder instead of vLLM's"
    )
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument(
        "--keep-tokens", type=int, default=16, help="pages whose output ids are kept (--tokens-out)"
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens-out", default=None)
    ap.add_argument("--engine-args", default="{}", help="extra LLM(...) kwargs as JSON")
    a = ap.parse_args()

    # Spawn, as the daemon does: this process runs threads (the NVML monitor, tokenizers) before
    # LLM() starts the engine core, and a child forked while another thread holds a lock can hang at
    # "Starting to load model".
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from ocrwatch.engines.deepseek import plugin

    # read by the plugin in every process vLLM starts
    os.environ[plugin.ENV] = "1" if a.fast else "0"

    mon = Monitor()
    mon.start()
    res: dict = dict(
        label=a.label,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        fast=a.fast,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        ngram=a.ngram,
        dpi=a.dpi,
        gpu_mem_start_gib=gib(mon.gpu_used()),
        rss_start_gib=gib(mon.rss()),
    )

    import pages as pagelib

    t0 = time.perf_counter()
    images = pagelib.render(pagelib.pdf_files([a.pdfs]), a.dpi)
    res.update(
        renderer=pagelib.renderer_name(),
        render_s=round(time.perf_counter() - t0, 1),
        unique_pages=len(images),
    )
    images = images * a.repeat
    res["pages"] = len(images)
    print(
        f"[{a.label}] {len(images)} pages rendered in {res['render_s']} s via {res['renderer']}",
        flush=True,
    )

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    from ocrwatch.engines.deepseek.arguments import NGRAM_PROCESSORS

    plugin.register()  # this process; the engine core loads it through the entry point
    res.update(vllm=vllm.__version__, torch=torch.__version__)
    res["input_prep"] = measure_input_prep(a.model, images)

    kw = dict(
        model=a.model,
        load_format="dummy",
        enable_prefix_caching=False,
        mm_processor_cache_gb=0,
        max_model_len=8192,
        max_num_seqs=a.max_num_seqs,
        gpu_memory_utilization=0.9,
        seed=0,
    )
    if a.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = a.max_num_batched_tokens
    if a.ngram != "none":
        kw["logits_processors"] = [NGRAM_PROCESSORS[a.ngram]]
    kw.update(json.loads(a.engine_args))
    t0 = time.perf_counter()
    llm = LLM(**kw)
    res["init_s"] = round(time.perf_counter() - t0, 1)
    res["gpu_mem_after_init_gib"] = gib(mon.gpu_used())
    print(f"[{a.label}] engine ready in {res['init_s']} s", flush=True)

    def sampling(max_tokens: int) -> SamplingParams:
        extra = (
            None
            if a.ngram == "none"
            else dict(ngram_size=30, window_size=90, whitelist_token_ids={128821, 128822})
        )
        return SamplingParams(
            temperature=0,
            max_tokens=max_tokens,
            ignore_eos=True,
            skip_special_tokens=False,
            extra_args=extra,
        )

    reqs = [{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images]
    t0 = time.perf_counter()
    llm.generate(reqs[: a.warmup], sampling(16), use_tqdm=False)
    res["warmup_s"] = round(time.perf_counter() - t0, 1)

    phases = []
    res["phases"] = phases
    try:
        run_phases(a, llm, reqs, sampling, phases)
    except KeyboardInterrupt:  # STEP_TIMEOUT: keep what was measured
        res["interrupted"] = True
    mon.stop = True
    res.update(
        gpu_mem_peak_gib=gib(mon.peak),
        gpu_mem_end_gib=gib(mon.gpu_used()),
        rss_end_gib=gib(mon.rss()),
    )
    print("RESULT " + json.dumps(res), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    os._exit(0)  # skip the slow teardown of the engine's threads


def run_phases(a, llm, reqs, sampling, phases) -> None:
    for mt in [int(x) for x in a.max_tokens.split(",")]:
        w0, t0 = time.time(), time.perf_counter()
        outs = llm.generate(reqs, sampling(mt), use_tqdm=False)
        dt = time.perf_counter() - t0
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        n_prompt = [len(o.prompt_token_ids) for o in outs]
        ph = dict(
            max_tokens=mt,
            t_start=round(w0, 2),
            t_end=round(time.time(), 2),
            gen_s=round(dt, 2),
            pages_per_s=round(len(outs) / dt, 3),
            out_tok_per_s=round(n_out / dt, 1),
            out_tokens=n_out,
            prompt_tokens_mean=round(sum(n_prompt) / len(n_prompt), 1),
            prompt_tokens_min_max=[min(n_prompt), max(n_prompt)],
        )
        phases.append(ph)
        print(
            f"[{a.label}] max_tokens={mt}: {ph['pages_per_s']} pages/s, {ph['out_tok_per_s']} "
            "tok/s",
            flush=True,
        )
        if a.tokens_out and mt == max(int(x) for x in a.max_tokens.split(",")):
            with open(a.tokens_out, "w") as f:
                json.dump([list(o.outputs[0].token_ids) for o in outs[: a.keep_tokens]], f)
        del outs


if __name__ == "__main__":
    main()
