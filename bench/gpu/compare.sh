#!/usr/bin/env bash
# What a user gets, in ONE call on one GPU, from the repository root (bench/gpu/README.md, "compare.sh"):
#   1. the daemon with its shipped defaults (the config names the model, load_format = "dummy", ignore_eos and
#      max_tokens = 1000: random weights need them), from cold caches: start to ready (broken down), a fresh
#      page alone into the urgent inbox, the corpus REPEAT times, doc300.pdf with another fresh page dropped
#      into a higher-priority inbox once 30 of its pages are done (and, with PHASES=solo,a,d0,d, doc300.pdf
#      alone); fresh: made at run time (fresh_page.py), so duplicate reuse cannot answer it from the ledger;
#   2. a warm restart of the same daemon (compile caches filled): start to ready, broken down;
#   3. the official script's shape on the same pages (engine_bench.py: render all, one LLM.generate(), vLLM's
#      own model class and n-gram processor, 256 sequences, 32,768 batched tokens).
# Ends with one JSON line (compare_result.py), also written to $OUT/compare.json, within BUDGET whatever a
# step does: each runs under step.py (steps.sh), cut at its share of the budget and stopped as a tree. Needs
# the wheel parts carried before (device_run.sh parts N), .gpu/dsocr2, .gpu/corpus and, on a machine without
# pdftoppm or tesseract, .gpu/poppler and .gpu/tesseract ([render] rotate_pages, on by default, needs
# tesseract with its osd data). The line names the settings that ran (rotation as the daemon resolved it,
# guard, runner, card) and that no page was answered by duplicate reuse (reused_pages). Knobs: REPEAT (1: 159 pages), PHASES (the cold daemon's load, default solo,a,d),
# BUDGET (540 s: the whole script, results packed, inside a 600-s call; a step still running at its share
# gets SIGINT, then every process it left SIGKILL 10 s later). On the lent H200 the two cold starts alone
# took about 310 s (daemon 176 s, script 134 s): the default load only just fits in one call; a longer one
# runs under bench/gpu/detached.sh.
set -uo pipefail
OUT=${OUT:-/tmp/ocw-out}; R=${RESULTS:-/tmp/ocw-results}; mkdir -p "$OUT" "$R"
T0=$(date +%s); BUDGET=${BUDGET:-540}; END=$(( T0 + BUDGET - 10 ))  # 10 s kept to pack and print
HERE=bench/gpu
REPEAT=${REPEAT:-1}
# Test seams (tests/test_gpu_harness.py): the install command and the two Python tools.
INSTALL=${INSTALL:-bash $HERE/install_on_device.sh}; E2E=${E2E:-$HERE/e2e.py}; BENCH=${BENCH:-$HERE/engine_bench.py}
# The line's tool as it was at the start, run isolated (python3 -I: no PYTHONPATH, no current folder): a
# detached run outlives the device call that started it, and the working tree a later call copies over (or
# env.sh's PYTHONPATH, /tmp/site first) must not change what prints its line. Once a detached run printed
# {"error": "compare_result.py failed"} where the same script afterwards printed the whole line.
TOOL=$(mktemp -d /tmp/ocw-compare-tool.XXXXXX); cp $HERE/compare_result.py "$TOOL/"
finish() {  # the JSON line, whatever was cut: every step ran under step.py, so nothing holds this script
  python3 -I "$TOOL/compare_result.py" "$R" > "$OUT/compare.json" 2> "$R/compare_result.err" \
    || grep -q '"error"' "$OUT/compare.json" 2>/dev/null \
    || printf '{"error": "compare_result.py failed: %s"}\n' "$(tail -1 "$R/compare_result.err" 2>/dev/null |
      tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g' | cut -c1-300)" > "$OUT/compare.json"
  tar czf "$OUT/results_compare.tgz" -C "$R" --exclude "series_*" . 2>/dev/null
  cat "$OUT/compare.json"
  rm -rf "$TOOL"
}
trap finish EXIT
# This run's results only: a line must never carry an earlier run's figures (engine.jsonl is appended to).
rm -f "$R/e2e_cold.json" "$R/e2e_warm.json" "$R/engine.jsonl" "$R/compare_result.err"
source $HERE/steps.sh
t0=$(date +%s)
step install $(until_leaving 400) $INSTALL || { tail -20 "$R/install.log"; exit 1; }
echo "install: $(( $(date +%s) - t0 )) s"
source $HERE/env.sh
# The shipped defaults turn pages upright with tesseract's osd data: without them the daemon stops at start.
if [ "${OCRWATCH_RENDER_ROTATE_PAGES:-true}" != false ]; then
  langs=$(tesseract --list-langs 2>&1) || true
  grep -qx osd <<< "$langs" || { echo "no tesseract with osd data: carry .gpu/tesseract (prepare.sh" \
    "tesseract; it needs $(cat .gpu/tesseract/glibc-needed 2>/dev/null || echo '?')): $(tail -c 300 <<< "$langs")" >&2
    exit 1; }
fi
export TORCHINDUCTOR_CACHE_DIR=/tmp/ocw-cold/inductor TRITON_CACHE_DIR=/tmp/ocw-cold/triton
# Cold: fresh compile caches (vLLM's, inductor's, Triton's), then the load: a page alone into the urgent inbox,
# the corpus REPEAT times, doc300.pdf with the urgent page (PHASES=solo,a,d0,d: doc300.pdf alone first).
rm -rf /tmp/ocw-cold; mkdir -p /tmp/ocw-cold
step e2e_cold $(until_leaving 270) python3 $E2E --label cold --out "$R" --repeat "$REPEAT" --max-tokens 1000 \
  --cache-dir /tmp/ocw-cold/vllm --phases "${PHASES:-solo,a,d}"
# Warm restart on the caches the cold start filled: start to ready only.
step e2e_warm $(until_leaving 195) python3 $E2E --label warm --out "$R" --max-tokens 1000 \
  --cache-dir /tmp/ocw-cold/vllm --phases none --port 9470
# The script's shape, its own fresh caches; its pages rendered with pypdfium2 (rendering is not timed).
export TORCHINDUCTOR_CACHE_DIR=/tmp/ocw-script/inductor TRITON_CACHE_DIR=/tmp/ocw-script/triton \
  VLLM_CACHE_ROOT=/tmp/ocw-script/vllm
PATH=${PATH//"$PWD/.gpu/poppler/bin:"/} step engine_script $(until_leaving 0) python3 $BENCH --label script \
  --repeat "$REPEAT" --max-tokens 1000 --max-num-seqs 256 --max-num-batched-tokens 32768 --ngram per_request \
  --out "$R/engine.jsonl"
