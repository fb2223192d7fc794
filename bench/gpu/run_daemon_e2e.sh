#!/usr/bin/env bash
# Device: the daemon end to end (issue 5, a/d/e), from the repository root, after the wheel parts were copied
# to /tmp/parts by earlier calls (`bash bench/gpu/device_run.sh parts N`), with .gpu carried in this call.
#   bash bench/gpu/run_daemon_e2e.sh [RUN...]      RUN: fast (default) | stock | fastwarm | stockwarm
#     fast / stock:          cold start (empty compile cache), then phases solo, a, d (see e2e.py)
#     fastwarm / stockwarm:  a second start on the now-warm compile cache, then one page (start-up only)
#   Never wrap this script in `timeout`: set STEP_TIMEOUT (s, default 560 per run) so results still come back.
#   E2E_ARGS="--repeat 2 --d-after 30 ..." passes options to e2e.py; OCRWATCH_SAM_ATTN picks the kernel.
# Results: $OUT/results_e2e.tgz (everything) and the summary on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/ocw-out}; R=/tmp/ocw-results; mkdir -p "$OUT" $R
trap 'tar czf "$OUT/results_e2e.tgz" -C $R .' EXIT
t0=$(date +%s)
bash bench/gpu/install_on_device.sh 2>&1 | tee $R/install_e2e.txt || exit 1
echo "install: $(( $(date +%s) - t0 )) s"
source bench/gpu/env.sh
for run in "${@:-fast}"; do
  case $run in
    fast) args="--fast" ;;
    stock) args="" ;;
    fastwarm) args="--fast --phases solo" ;;
    stockwarm) args="--phases solo" ;;
    *) echo "unknown run $run"; continue ;;
  esac
  nvidia-smi dmon -s um -o DT -d 1 > $R/dmon_e2e_$run.txt 2>&1 & DMON=$!
  timeout -s INT -k 30 ${STEP_TIMEOUT:-560} python3 bench/gpu/e2e.py --label $run $args --cache-dir /tmp/ocw-e2e-cache-${run%warm} --out $R ${E2E_ARGS:-} 2>&1 \
    | tee $R/e2e_$run.log | grep --line-buffered -E "^\[|Traceback|Error" | cut -c1-300
  kill $DMON 2>/dev/null
  tail -5 $R/daemon_$run.log 2>/dev/null | cut -c1-300
done
python3 bench/gpu/summarize.py $R > $R/summary.md 2>&1; cat $R/summary.md
