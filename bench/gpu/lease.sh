#!/usr/bin/env bash
# One lease's whole load, run detached (bench/gpu/README.md, "One lease"): compare.sh on the shipped defaults,
# then each experiment of EXTRA as a phase-`a` run of e2e.py on the compile caches compare.sh filled, so its
# pages/s stand beside the compare line's on the same card.
#   EXTRA="rotoff:OCRWATCH_RENDER_ROTATE_PAGES=false dsocr1:MODEL=.gpu/dsocr1" \
#     bash bench/gpu/detached.sh start 560 bash bench/gpu/lease.sh
# Each experiment is LABEL:VAR=VALUE[,VAR=VALUE...]; MODEL picks the model directory, every other VAR is the
# daemon's environment (a shipped default changed by one variable, as a user would). Knobs: compare.sh's
# (BUDGET, PHASES, REPEAT), EXTRA_BUDGET (seconds for each experiment, 300). Results: compare.sh's
# compare.json and results tarball, and e2e_LABEL.json for each experiment, under OUT (/tmp/ocw-out).
set -uo pipefail
OUT=${OUT:-/tmp/ocw-out}; R=${RESULTS:-/tmp/ocw-results}; mkdir -p "$OUT" "$R"
HERE=bench/gpu
BUDGET=${BUDGET:-900} PHASES=${PHASES:-solo,a,d0,d} REPEAT=${REPEAT:-3} bash $HERE/compare.sh
source $HERE/env.sh
export TORCHINDUCTOR_CACHE_DIR=/tmp/ocw-cold/inductor TRITON_CACHE_DIR=/tmp/ocw-cold/triton
source $HERE/steps.sh
for experiment in ${EXTRA:-}; do
  label=${experiment%%:*}; model=.gpu/dsocr2; vars=()
  IFS=, read -ra pairs <<< "${experiment#*:}"
  for pair in "${pairs[@]}"; do
    case $pair in MODEL=*) model=${pair#MODEL=} ;; *=*) vars+=("$pair") ;; esac
  done
  END=$(( $(date +%s) + ${EXTRA_BUDGET:-300} ))
  step "e2e_$label" "$(until_leaving 0)" env "${vars[@]}" python3 $HERE/e2e.py --label "$label" \
    --out "$R" --model "$model" --repeat "${REPEAT:-3}" --max-tokens 1000 --cache-dir /tmp/ocw-cold/vllm \
    --phases a --port 9480
  cp "$R/e2e_$label.json" "$OUT/" 2>/dev/null || echo "$label: no result" >&2
done
