#!/usr/bin/env bash
# Device-side driver for the GPU benchmark (run 1 of issue 5).  One step per `run` call, from the repo root:
#   bash bench/gpu/device_run.sh parts N      copy .whl/partN to /tmp/parts (+ a probe of the machine with N=0)
#   bash bench/gpu/device_run.sh check        install, then the fast-vs-stock equality check + encoder timings
#   bash bench/gpu/device_run.sh stock        engine bench, vLLM's own class (b), nvidia-smi dmon alongside
#   bash bench/gpu/device_run.sh fast [V...]  engine bench with the fast encoder; variants: base seqs256 nongram
# Everything worth keeping goes to $OUT (and /tmp/ocw-results, which later calls on the same machine read).
# Never wrap this script in `timeout`: set STEP_TIMEOUT (seconds, default 540) and each python step is
# stopped with SIGINT in time for the results to be bundled.  Console lines go through grep --line-buffered
# (a plain grep into a pipe holds its output back and loses it when killed: run 1 lost a whole step so).
set -uo pipefail
step=${1:?step}; shift
OUT=${OUT:-/tmp/ocw-out}; R=/tmp/ocw-results; mkdir -p "$OUT" $R
HERE=bench/gpu
# $OUT brings back at most 8 files: logs go to $R, and each step ends with $OUT/results_<step>.tgz of all of $R.
dmon_start() { nvidia-smi dmon -s um -o DT -d 1 > "$R/dmon_$1.txt" 2>&1 & DMON=$!; }
dmon_stop() { kill $DMON 2>/dev/null; }
bundle() { tar czf "$OUT/results_$step.tgz" -C $R . ; }
trap bundle EXIT
case $step in
  parts)
    n=${1:?part number}
    mkdir -p /tmp/parts && cp .whl/part$n/* /tmp/parts/ && ls -l /tmp/parts
    if [ "$n" = 0 ]; then
      { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv;
        python3 --version; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available(), "gpus", torch.cuda.device_count())'; nvidia-smi topo -m;
        for b in pdftoppm pdfinfo xz zstd nvcc gcc; do printf '%s: %s\n' $b "$(command -v $b || echo MISSING)"; done;
        nproc; free -g | head -2; df -h /tmp | tail -1; } 2>&1 | tee $R/probe.txt
    fi ;;
  check)
    t0=$(date +%s)
    bash $HERE/install_on_device.sh 2>&1 | tee $R/install.txt || exit 1
    echo "install: $(( $(date +%s) - t0 )) s" | tee -a $R/install.txt
    source $HERE/env.sh
    timeout -s INT -k 20 ${STEP_TIMEOUT:-540} python3 $HERE/encoder_check.py --pages ${CHECK_PAGES:-10} --bench-pages ${BENCH_PAGES:-32} \
      --impls ${IMPLS:-sdpa,concat,flex} ${CHECK_ARGS:---compile} --profile $R \
      --out $R/encoder_check.jsonl 2>&1 | grep --line-buffered -v -E "incorrect regex|fix_mistral_regex|instantiate a model of type" \
      | tee $R/encoder_check.txt
    echo "check step: $(( $(date +%s) - t0 )) s" ;;
  stock)
    source $HERE/env.sh
    dmon_start stock
    timeout -s INT -k 20 ${STEP_TIMEOUT:-540} python3 $HERE/engine_bench.py --label stock --repeat ${REPEAT:-2} --max-tokens ${MAX_TOKENS:-1000,1} \
      --out $R/engine.jsonl --tokens-out $R/tokens_stock.json 2>&1 | tee $R/engine_stock.log \
      | grep --line-buffered -E "^\[stock\]|RESULT|Error|error|Traceback|init engine|compiled graph|Compiling a graph|torch.compile take|Model loading took|KV cache" | cut -c1-400
    dmon_stop ;;
  fast)
    source $HERE/env.sh
    best=$(python3 - <<'PY'
import json
try:
    lines = [json.loads(l) for l in open("/tmp/ocw-results/encoder_check.jsonl")]
    t = lines[-1]["timing"]; c = lines[-1]["checks"]
    ok = [k for k in ("flex", "concat", "sdpa") if c.get(k, {}).get("pass") and "ms_per_page" in t.get(k, {})]
    print(min(ok, key=lambda k: t[k]["ms_per_page"]) if ok else "concat")
except Exception:
    print("concat")
PY
)
    export OCRWATCH_SAM_ATTN=${OCRWATCH_SAM_ATTN:-$best}
    echo "fast encoder: global attention $OCRWATCH_SAM_ATTN" | tee $R/fast_choice.txt
    for v in "${@:-base}"; do
      case $v in
        base)    args="--max-tokens ${MAX_TOKENS:-1000,1}" ;;
        seqs256) args="--max-tokens 1000,1 --max-num-seqs 256 --max-num-batched-tokens 32768" ;;
        nongram) args="--max-tokens 1000 --ngram none" ;;
        *) echo "unknown variant $v"; continue ;;
      esac
      dmon_start fast_$v
      timeout -s INT -k 20 ${STEP_TIMEOUT:-540} python3 $HERE/engine_bench.py --label fast_$v --fast --repeat ${REPEAT:-2} $args \
        --out $R/engine.jsonl --tokens-out $R/tokens_fast_$v.json 2>&1 | tee $R/engine_fast_$v.log \
        | grep --line-buffered -E "^\[fast|RESULT|Error|error|Traceback|init engine|compiled graph|Compiling a graph|torch.compile take|Model loading took|KV cache|ocrwatch" | cut -c1-400
      dmon_stop
    done
    python3 $HERE/summarize.py $R > $R/summary.md 2>&1; cat $R/summary.md ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
