#!/usr/bin/env bash
# vLLM's V1 and V2 model runners on the same pages, greedy, no guard, in ONE call (after the `parts` calls):
# engine_bench.py twice (VLLM_USE_V2_MODEL_RUNNER=0, then 1), then how many of the kept pages' output ids agree
# between them (runners_tokens.py), the check before the V2 runner becomes ocrwatch's default for DeepSeek-OCR.
# Knobs: REPEAT (1), MAX_TOKENS (1000), KEEP (64 pages' ids kept), BUDGET (540 s).
set -uo pipefail
OUT=${OUT:-/tmp/ocw-out}; R=${RESULTS:-/tmp/ocw-results}; mkdir -p "$OUT" "$R"
T0=$(date +%s); BUDGET=${BUDGET:-540}; END=$(( T0 + BUDGET - 10 ))
HERE=bench/gpu
trap 'python3 $HERE/runners_tokens.py $R/tokens_v1.json $R/tokens_v2.json | tee $OUT/runners.json;
  tar czf $OUT/results_runners.tgz -C $R .' EXIT
source $HERE/steps.sh
step install $(until_leaving 400) bash $HERE/install_on_device.sh || { tail -20 "$R/install.log"; exit 1; }
source $HERE/env.sh
for v in 1 2; do
  ( export VLLM_USE_V2_MODEL_RUNNER=$(( v - 1 ))
  step engine_v$v $(until_leaving $(( v == 1 ? 200 : 0 ))) python3 $HERE/engine_bench.py --label v$v --repeat "${REPEAT:-1}" --max-tokens "${MAX_TOKENS:-1000}" \
    --max-num-seqs 256 --max-num-batched-tokens 32768 --ngram none --fast --keep-tokens "${KEEP:-64}" \
    --out "$R/engine.jsonl" --tokens-out "$R/tokens_v$v.json" )
done
