#!/usr/bin/env bash
# The GPU benchmarks on one GPU, run on the GPU machine from the repository root, one step per call:
#   bash bench/gpu/device_run.sh parts N     copy .whl/partN to /tmp/parts (N=0 also probes the machine)
#   bash bench/gpu/device_run.sh check       the vision encoder: ocrwatch's against vLLM's, equality then timing
#   bash bench/gpu/device_run.sh script      the official script's shape: render every page, one LLM.generate(),
#                                            vLLM's own model class and n-gram processor (engine_bench.py)
#   bash bench/gpu/device_run.sh engine      the same with ocrwatch's batched encoder and n-gram processor
#   bash bench/gpu/device_run.sh daemon      the daemon end to end (e2e.py): cold start, one page alone, the corpus,
#                                            an urgent page behind doc300.pdf; then a warm restart
#   bash bench/gpu/device_run.sh moe         tune the fused-MoE tiles for this GPU (tune_moe.py)
#   bash bench/gpu/device_run.sh ngram       the n-gram guard's cost per decode step and equality (ngram_bench.py)
#   bash bench/gpu/device_run.sh smoke       the checks before compare.sh: encoder_check.py over the page geometries,
#                                            the GPU n-gram kernel against the host rule, then DeepSeek-OCR
#                                            (.gpu/dsocr1) through the daemon on its defaults (.gpu/mini pages)
# Every step after `parts` installs the unpacked wheels first (install_on_device.sh, once per machine) and needs
# .gpu (prepare.sh) beside the repository.  Knobs: REPEAT (corpus copies, 3), MAX_TOKENS (forced output tokens
# a page, 1000), SEQS and BATCHED (max_num_seqs and max_num_batched_tokens; unset: each tool's default),
# E2E_ARGS / BENCH_ARGS (more options for e2e.py / engine_bench.py), BUDGET (seconds for the whole step, 560).
# Results: every file under /tmp/ocw-results, packed as $OUT/results_<step>.tgz; summarize.py's tables on stdout.
# Every step runs under step.py (steps.sh): a process group of its own, its output in $R/LABEL.log; still running
# 20 s before BUDGET ends, it gets SIGINT (a Python step writes what it measured), and 10 s later everything it
# left gets SIGKILL. A `timeout` around this whole script would kill it before the results are packed.
set -uo pipefail
step=${1:?step}; shift
OUT=${OUT:-/tmp/ocw-out}; R=/tmp/ocw-results; mkdir -p "$OUT" $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
HERE=bench/gpu
REPEAT=${REPEAT:-3}; MAX_TOKENS=${MAX_TOKENS:-1000}
sizes="${SEQS:+--max-num-seqs $SEQS} ${BATCHED:+--max-num-batched-tokens $BATCHED}"
END=$(( T0 + BUDGET - 20 ))  # 20 s kept to pack the results and print the summary
bundle() { tar czf "$OUT/results_$step.tgz" -C $R . ; }
trap bundle EXIT
source $HERE/steps.sh  # step LABEL UNTIL CMD...: a process group of its own, output in $R/LABEL.log
STEP_SHOW='^\[|RESULT|Traceback|Error|rows|MISMATCH|^M=|wrote|pass|FAIL'
dmon() { nvidia-smi dmon -s um -o DT -d 1 > "$R/dmon_$1.txt" 2>&1 & DMON=$!; }
install() {
  local t0; t0=$(date +%s)
  step install $(until_leaving 60) bash $HERE/install_on_device.sh || { tail -20 $R/install.log; exit 1; }
  echo "install: $(( $(date +%s) - t0 )) s"
  source $HERE/env.sh
}
summary() { python3 $HERE/summarize.py $R > $R/summary.md 2>&1; cat $R/summary.md; }
e2e() {  # label, e2e.py arguments...
  local label=$1; shift
  dmon e2e_$label
  step e2e_$label $(until_leaving 0) python3 $HERE/e2e.py --label "$label" --out $R --repeat $REPEAT \
    --max-tokens $MAX_TOKENS $sizes "$@" ${E2E_ARGS:-}
  kill $DMON 2>/dev/null
  tail -3 $R/daemon_$label.log 2>/dev/null | cut -c1-300
}
engine_bench() {  # label, engine_bench.py arguments...
  local label=$1; shift
  dmon $label
  step engine_$label $(until_leaving 0) python3 $HERE/engine_bench.py --label "$label" --repeat $REPEAT \
    --max-tokens $MAX_TOKENS $sizes "$@" ${BENCH_ARGS:-} --out $R/engine.jsonl --tokens-out $R/tokens_$label.json
  kill $DMON 2>/dev/null
}
case $step in
  parts)
    n=${1:?part number}
    mkdir -p /tmp/parts && cp .whl/part$n/* /tmp/parts/ && ls -l /tmp/parts
    if [ "$n" = 0 ]; then
      { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 --version
        python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available(), "gpus", torch.cuda.device_count())'
        for b in pdftoppm pdfinfo xz nvcc gcc; do printf '%s: %s\n' $b "$(command -v $b || echo MISSING)"; done
        nproc; free -g | head -2; df -h /tmp | tail -1; } 2>&1 | tee $R/probe.txt
    fi ;;
  check)
    install
    step encoder_check $(until_leaving 0) python3 $HERE/encoder_check.py --pages ${CHECK_PAGES:-10} \
      --bench-pages ${BENCH_PAGES:-32} ${CHECK_ARGS:-} --out $R/encoder_check.jsonl
    summary ;;
  script)
    install; engine_bench script --ngram per_request; summary ;;
  engine)
    install; engine_bench engine --fast --ngram batched; summary ;;
  daemon)
    install
    e2e cold --cache-dir /tmp/ocw-e2e-cache
    [ "$(left)" -gt 120 ] && e2e warm --cache-dir /tmp/ocw-e2e-cache --phases solo
    summary ;;
  moe)
    install
    step tune_moe $(until_leaving 0) python3 $HERE/tune_moe.py --out $R/moe-configs --budget-s $(( $(left) - 60 )) "$@" ;;
  ngram)
    install
    step ngram $(until_leaving 0) python3 $HERE/ngram_bench.py "$@" ;;
  smoke)
    install
    step encoder_check $(( $(date +%s) + 150 )) python3 $HERE/encoder_check.py --pages 0 --bench-pages 16 \
      --out $R/encoder_check.jsonl
    step ngram $(( $(date +%s) + 90 )) python3 $HERE/ngram_bench.py --only gpu --rows 64,256 --steps 150
    CORPUS_DIR=${CORPUS_DIR:-.gpu/mini}
    e2e ocr1 --model .gpu/dsocr1 --corpus $CORPUS_DIR --repeat 1 --cache-dir /tmp/ocw-ocr1-cache --phases solo,a
    python3 -c "import json,sys; r=json.load(open('$R/e2e_ocr1.json')); print('ocr1', json.dumps({k: r.get(k) for k in ('start_to_ready_s','solo_latency_s','restart')}), json.dumps({k: r.get('a',{}).get(k) for k in ('pages','pages_per_s','status','failed_pages')}))" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
