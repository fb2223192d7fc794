#!/usr/bin/env bash
# The n-gram guard's candidates in ONE call on one GPU, each a daemon of its own on the same pages (phase a:
# every corpus PDF REPEAT times), the compile caches shared (the first lane of each runner fills them), from
# the repository root after the `parts` calls (bench/gpu/README.md, "guard.sh"). LANES, in order (default:
# imports off ban v2off v2gpu):
#   imports   imports.sh first, before any lane compiles bytecode: the engine's imports with and without it
#   off       V1 runner (VLLM_USE_V2_MODEL_RUNNER=0), the guard off in every rung (no logits processor)
#   ban       V1 runner, DeepSeek's n-gram rule as ocrwatch's batched logits processor (the default until
#             2026-12-02)
#   v2off     V2 runner (VLLM_USE_V2_MODEL_RUNNER=1), the guard off: the speed to match
#   v2gpu     V2 runner with ngram_processor = "gpu" (ocrwatch's kernel in the V2 sampler): the shipped default
#   stop      guard = "stop": vLLM's repetition stop, no logits processor (stop_pattern 32, stop_count 16), on
#             the runner ocrwatch asks for (V2); random weights loop at once, so it ends every page early
#   stop16    the same with stop_pattern 16
# Every step runs under step.py (a process group of its own, its output in a file, cut at its deadline and
# stopped as a tree); a lane starts only with LANE_S (240) seconds left. Ends, whatever was cut, with
# guard_result.py's line (also $OUT/guard.json) and $OUT/results_guard.tgz. Knobs: REPEAT (3), BUDGET (900 s:
# run it under detached.sh), E2E_ARGS (more e2e.py options for every lane).
set -uo pipefail
OUT=${OUT:-/tmp/ocw-out}; R=${RESULTS:-/tmp/ocw-results}; mkdir -p "$OUT" "$R"
T0=$(date +%s); BUDGET=${BUDGET:-900}; END=$(( T0 + BUDGET - 15 ))
HERE=bench/gpu; REPEAT=${REPEAT:-3}; LANE_S=${LANE_S:-240}
finish() {
  python3 $HERE/guard_result.py "$R" > "$OUT/guard.json" 2>/dev/null \
    || echo '{"error": "guard_result.py failed"}' > "$OUT/guard.json"
  tar czf "$OUT/results_guard.tgz" -C "$R" --exclude 'series_*' . 2>/dev/null
  cat "$OUT/guard.json"
}
trap finish EXIT
source $HERE/steps.sh
step install $(until_leaving 0) bash $HERE/install_on_device.sh || { tail -20 "$R/install.log"; exit 1; }
source $HERE/env.sh
export TORCHINDUCTOR_CACHE_DIR=/tmp/ocw-guard/inductor TRITON_CACHE_DIR=/tmp/ocw-guard/triton
lane() {  # label, e2e.py options
  local label=$1; shift
  local left=$(( END - $(date +%s) ))
  if [ $left -lt "$LANE_S" ]; then echo "[$label] not run: $left s left"; return; fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed "s/^/[$label] GPU memory before: /"
  step "e2e_$label" $(until_leaving 0) python3 $HERE/e2e.py --label "$label" --out "$R" --repeat "$REPEAT" \
    --max-tokens 1000 --cache-dir /tmp/ocw-guard/vllm --phases a --timeout 400 "$@" ${E2E_ARGS:-}
}
V2_CACHE=/tmp/ocw-guard/vllm-v2  # the V2 runner compiles a graph of its own
for name in ${LANES:-imports off ban v2off v2gpu}; do
  case $name in
    imports) step imports $(until_leaving 0) bash $HERE/imports.sh ;;
    off) ( export VLLM_USE_V2_MODEL_RUNNER=0; lane off --ngram-processor none ) ;;
    ban) ( export VLLM_USE_V2_MODEL_RUNNER=0; lane ban --ngram-processor batched ) ;;
    v2off) ( export VLLM_USE_V2_MODEL_RUNNER=1; lane v2off --ngram-processor none --cache-dir $V2_CACHE ) ;;
    v2gpu) ( export VLLM_USE_V2_MODEL_RUNNER=1; lane v2gpu --ngram-processor gpu --cache-dir $V2_CACHE ) ;;
    stop) lane stop --guard stop --cache-dir $V2_CACHE ;;
    stop16) lane stop16 --guard stop --stop-pattern 16 --cache-dir $V2_CACHE ;;
    *) echo "unknown lane $name" ;;
  esac
done
