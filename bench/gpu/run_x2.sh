#!/usr/bin/env bash
# The GPU benchmarks that need two GPUs of one host, run there from the repository root after
# `bash bench/gpu/device_run.sh parts N` for every part:
#   bash bench/gpu/run_x2.sh pair       the daemon (e2e.py, phase a) on GPU 0 and, at the same time, the official
#                                       script's shape (engine_bench.py, vLLM's own class and n-gram processor) on
#                                       GPU 1, on the same pages
#   bash bench/gpu/run_x2.sh replicas   the daemon on GPU 0 alone, then `replicas = 2` on both GPUs alone on twice
#                                       the pages (REPLICA_PROCESSES=true|false sets replica_processes; unset: the
#                                       daemon's default)
#   bash bench/gpu/run_x2.sh dp | tp    one engine over both GPUs with vLLM's data_parallel_size = 2 (twice the
#                                       pages) or tensor_parallel_size = 2
# Engine settings, the same in every lane: SEQS (256) sequences, BATCHED (32768) batched tokens, FAST (1:
# fast_encoder = true; 0: the default), NGRAM (batched | per_request | none: the guard off), 1,000 forced output
# tokens a page, every corpus PDF REPEAT (3) times.  BUDGET (560 s) bounds the whole step: each python step gets
# SIGINT in time to write what it measured.  Results: $OUT/results_<step>.tgz and summarize.py's tables.
set -uo pipefail
step=${1:?step}
OUT=${OUT:-/tmp/ocw-out}; R=/tmp/ocw-results; mkdir -p "$OUT" $R
trap 'tar czf "$OUT/results_$step.tgz" -C $R .' EXIT
T0=$(date +%s); BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
SEQS=${SEQS:-256}; BATCHED=${BATCHED:-32768}; REPEAT=${REPEAT:-3}; NGRAM=${NGRAM:-batched}
common="--max-num-seqs $SEQS --max-num-batched-tokens $BATCHED --max-tokens 1000 --ngram-processor $NGRAM"
[ "${FAST:-1}" = 1 ] && common+=" --fast"
HERE=bench/gpu; END=$(( T0 + BUDGET - 15 ))
source $HERE/steps.sh  # step LABEL UNTIL CMD...: a process group of its own, output in $R/LABEL.log
step install_$step $(until_leaving 60) bash $HERE/install_on_device.sh || { tail -20 $R/install_$step.log; exit 1; }
echo "install: $(( $(date +%s) - T0 )) s"
source $HERE/env.sh
e2e() {  # label, seconds, e2e.py arguments... (step.py stops the lane's whole tree, engine cores included,
         # before the next lane starts)
  local label=$1 secs=$2; shift 2
  nvidia-smi dmon -s um -o DT -d 1 > $R/dmon_e2e_$label.txt 2>&1 & local dmon=$!
  step e2e_$label $(( $(date +%s) + secs )) python3 $HERE/e2e.py --label "$label" --out $R --phases a \
    --timeout $(( secs - 30 )) $common "$@"
  kill $dmon 2>/dev/null
  tail -3 $R/daemon_$label.log 2>/dev/null | cut -c1-300
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' '; echo
}
case $step in
  pair)
    ( export CUDA_VISIBLE_DEVICES=0
      e2e one $(( $(left) - 15 )) --repeat $REPEAT --cache-dir /tmp/ocw-e2e-cache-1 --work /tmp/ocw-e2e-0 ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      nvidia-smi dmon -i 1 -s um -o DT -d 1 > $R/dmon_script.txt 2>&1 & dmon=$!
      step engine_script $(until_leaving 0) python3 $HERE/engine_bench.py --label script --ngram per_request \
        --max-tokens 1000 --max-num-seqs $SEQS --max-num-batched-tokens $BATCHED --repeat $REPEAT \
        --out $R/engine.jsonl
      kill $dmon ) &
    gpu1=$!
    wait $gpu0 $gpu1 ;;
  replicas)
    ( export CUDA_VISIBLE_DEVICES=0
      e2e one ${ONE_S:-250} --repeat $REPEAT --cache-dir /tmp/ocw-e2e-cache-1 --work /tmp/ocw-e2e-0 )
    CUDA_VISIBLE_DEVICES=0,1 e2e rep $(( $(left) - 20 )) --repeat $(( REPEAT * 2 )) --replicas 2 \
      ${REPLICA_PROCESSES:+--replica-processes $REPLICA_PROCESSES} --cache-dir /tmp/ocw-e2e-cache-1 \
      --port 9465 --work /tmp/ocw-e2e-r ;;
  dp)
    CUDA_VISIBLE_DEVICES=0,1 e2e dp $(( $(left) - 20 )) --repeat $(( REPEAT * 2 )) --dp 2 \
      --cache-dir /tmp/ocw-e2e-cache-dp --port 9465 --work /tmp/ocw-e2e-dp ;;
  tp)
    CUDA_VISIBLE_DEVICES=0,1 e2e tp $(( $(left) - 20 )) --repeat $REPEAT --tp 2 \
      --cache-dir /tmp/ocw-e2e-cache-tp --port 9465 --work /tmp/ocw-e2e-tp ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
python3 bench/gpu/summarize.py $R > $R/summary.md 2>&1; tail -40 $R/summary.md
echo "step $step: $(( $(date +%s) - T0 )) s"
