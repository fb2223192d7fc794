#!/usr/bin/env bash
# Device: issue 5's same-run comparison and issue 9's data/tensor parallelism, on nvidia-h200-x2.
# From the repository root, after `bash bench/gpu/device_run.sh parts 0|1|2` (one call each), carrying .gpu
# (and .whl/part3 in the first of these calls):
#   bash bench/gpu/run_x2.sh one     GPU 0: the daemon end to end (solo, a, d) with the fast encoder and the
#                                    batched n-gram processor, every process's stacks sampled PROFILE_AT s into
#                                    (a) for 15 s, then a warm restart; GPU 1 at the same time: the official
#                                    script's shape with vLLM's own class and processor (b)
#   bash bench/gpu/run_x2.sh dp      phase a on both GPUs with data_parallel_size = 2 (twice the pages)
#   bash bench/gpu/run_x2.sh tp      phase a on both GPUs with tensor_parallel_size = 2
#   bash bench/gpu/run_x2.sh rep     phase a on both GPUs with replicas = 2 (ocrwatch's own, no lockstep)
#                                    (CACHE=1gpu reuses the compile cache of `one`; dp takes DP_ENGINE_ARGS, e.g. '{"enable_expert_parallel":true}')
#   bash bench/gpu/run_x2.sh all     (a) on GPU 0 (profiled) beside (b) on GPU 1, LANE_S (280) s each, then
#                                    replicas = 2 on both GPUs on twice the pages (REPEAT=3 fits one 600 s call:
#                                    a cold start is 120-140 s, b's engine start 90 s); GRAPHS=1 for the
#                                    encoder's CUDA graphs
#   bash bench/gpu/run_x2.sh six     run 6: MoE tiles tuned, then (a) with them (profiled) and (a) without the n-gram
#                                    processor on GPU 0; (b) on GPU 1 with the time it needs
#   bash bench/gpu/run_x2.sh gr      run 7: (a) with the encoder's CUDA graphs on GPU 0 beside (a) eager on GPU 1
#   bash bench/gpu/run_x2.sh g       run 5: the encoder's CUDA graphs (daemon on GPU 0 + equality on GPU 1), then
#                                    replicas = 2 on both GPUs
#   bash bench/gpu/run_x2.sh moe     tune the fused-MoE tiles for DeepSeek-OCR's experts (bench/gpu/tune_moe.py)
#   bash bench/gpu/run_x2.sh b       (b) alone on GPU 0 (two engines starting at once hung in `one`)
#   bash bench/gpu/run_x2.sh nine    run 8 (issue 9): (a) on GPU 0 alone, then replicas = 2 alone on twice the pages
#                                    (NGRAM=none: both without the n-gram logits processor, on vLLM's V2 runner;
#                                    REPEAT=3 is what a 560 s call holds, the default 6 is not;
#                                    REPLICA_PROCESSES=true|false: replica_processes, else the daemon's
#                                    default "auto", which is true for replicas = 2 since run 9)
#   bash bench/gpu/run_x2.sh solo    run 9: (a) on GPU 0 with the engine in a child process, then (a) in the daemon's
#                                    process, one after the other (REPEAT=3; BUDGET 440 holds both from cold)
#   bash bench/gpu/run_x2.sh ninedp  run 8: (a) on GPU 0 alone (the compile cache of `nine` when the machine is the
#                                    same), then data_parallel_size = 2 alone on twice the pages
# Same engine settings throughout: SEQS (256) sequences, BATCHED (32768) batched tokens, 1,000 forced output
# tokens a page (random weights), 144 dpi, every corpus PDF REPEAT (6) times.  Results: $OUT/results_<step>.tgz.
# Never wrap this script in `timeout`: BUDGET (s, default 560) bounds the step and each python step gets SIGINT
# in time for its results to be written.
set -uo pipefail
step=${1:?step}
OUT=${OUT:-/tmp/ocw-out}; R=/tmp/ocw-results; mkdir -p "$OUT" $R
trap 'tar czf "$OUT/results_$step.tgz" -C $R .' EXIT
t0=$(date +%s); BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
SEQS=${SEQS:-256}; BATCHED=${BATCHED:-32768}; REPEAT=${REPEAT:-6}; NGRAM=${NGRAM:-batched}
common="--max-num-seqs $SEQS --max-num-batched-tokens $BATCHED --repeat $REPEAT"
bash bench/gpu/install_on_device.sh > $R/install_$step.txt 2>&1 || { tail -20 $R/install_$step.txt; exit 1; }
echo "install: $(( $(date +%s) - t0 )) s"
source bench/gpu/env.sh
export OCRWATCH_SAM_ATTN=${OCRWATCH_SAM_ATTN:-concat}
show() { grep --line-buffered -E "^\[|RESULT|Traceback|Error" | cut -c1-400; }
e2e() {  # label, seconds, e2e.py arguments...
  local label=$1 secs=$2; shift 2
  nvidia-smi dmon -s um -o DT -d 1 > $R/dmon_e2e_$label.txt 2>&1 & local dmon=$!
  timeout -s INT -k 30 "$secs" python3 bench/gpu/e2e.py --label "$label" --out $R "$@" 2>&1 | tee $R/e2e_$label.log | show
  kill $dmon 2>/dev/null
  tail -3 $R/daemon_$label.log 2>/dev/null | cut -c1-300
}
stock() {  # (b) on the visible GPU within $1 seconds: vLLM's own class and n-gram processor, LLM.generate()
  nvidia-smi dmon -i $CUDA_VISIBLE_DEVICES -s um -o DT -d 1 > $R/dmon_stock.txt 2>&1 & local dmon=$!
  timeout -s INT -k 20 "$1" python3 bench/gpu/engine_bench.py --label stock --ngram per_request --max-tokens 1000 $common \
    --out $R/engine.jsonl --tokens-out $R/tokens_stock.json 2>&1 | tee $R/engine_stock.log | show
  kill $dmon
}
replicas() {  # replicas = 2 on both GPUs, twice the pages, the compile cache $1, further e2e.py arguments after it
  local cache=$1; shift
  CUDA_VISIBLE_DEVICES=0,1 e2e rep $(( $(left) - 20 )) --fast --ngram-processor batched $common --repeat $(( REPEAT * 2 )) \
    --replicas 2 --phases a --cache-dir "$cache" --port 9465 --work /tmp/ocw-e2e-r --timeout $(( $(left) - 40 )) "$@"
}
reap() {  # a lane cut by its time limit can leave its daemon's engine cores holding a GPU (run 8a did)
  pkill -9 -f "ocrwatch run --config /tmp/ocw-e2e" 2>/dev/null; pkill -9 -f "ocrwatch.engines.process" 2>/dev/null
  pkill -9 -f "VLLM::EngineCore" 2>/dev/null; sleep 3
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' '; echo
}
parallel() {  # dp | tp: one engine over both GPUs, vLLM's data or tensor parallelism
  export CUDA_VISIBLE_DEVICES=0,1
  local pages
  case $1 in
    dp) pages="--repeat $(( REPEAT * 2 )) --dp 2 --engine-args ${DP_ENGINE_ARGS:-{\}}" ;;
    tp) pages="--repeat $REPEAT --tp 2" ;;
  esac
  e2e $1 $(( $(left) - 15 )) --fast --ngram-processor batched --max-num-seqs $SEQS --max-num-batched-tokens $BATCHED \
    $pages --phases a --cache-dir /tmp/ocw-e2e-cache-${CACHE:-$1} --port 9465 --timeout $(( $(left) - 40 ))
}
case $step in
  one)
    ( export CUDA_VISIBLE_DEVICES=0
      e2e fast $(( $(left) - 100 )) --fast --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-1gpu \
        --port 9464 --work /tmp/ocw-e2e-0 --profile-at ${PROFILE_AT:-60} --profile-seconds 15 --timeout 300
      # the same daemon again with the compile cache it just filled: warm start to ready, one page
      [ "$(left)" -gt 70 ] && e2e warm $(( $(left) - 10 )) --fast --ngram-processor batched $common \
        --cache-dir /tmp/ocw-e2e-cache-1gpu --port 9464 --work /tmp/ocw-e2e-0 --phases solo ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      stock $(( $(left) - 15 )) ) &
    gpu1=$!
    wait $gpu0 $gpu1 ;;
  rep)  # twice the pages for two replicas: each GPU sees the load of `one`'s GPU
    replicas /tmp/ocw-e2e-cache-${CACHE:-rep} ;;
  dp|tp)  # twice the pages for two data-parallel ranks; tensor parallelism splits `one`'s load over both GPUs
    parallel $step ;;
  nine|ninedp)  # run 8 (2026-11-29): one GPU alone, then both GPUs alone, same settings, in one call
    ( export CUDA_VISIBLE_DEVICES=0
      e2e one ${ONE_S:-250} --fast --ngram-processor $NGRAM $common --cache-dir /tmp/ocw-e2e-cache-9 \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --timeout $(( ${ONE_S:-250} - 30 )) )
    reap
    case $step in
      nine) replicas /tmp/ocw-e2e-cache-9 --ngram-processor $NGRAM ${REPLICA_PROCESSES:+--replica-processes $REPLICA_PROCESSES} ;;
      ninedp) parallel dp ;;
    esac ;;
  solo)  # run 9: one GPU with its engine in a child process (replica_processes = true, cold compile cache), then
         # the same in the daemon's process (warm cache), one after the other on GPU 0, in one call
    ( export CUDA_VISIBLE_DEVICES=0
      e2e onep ${ONE_S:-250} --fast --ngram-processor $NGRAM $common --cache-dir /tmp/ocw-e2e-cache-9 --replica-processes \
        --port 9464 --work /tmp/ocw-e2e-p --phases a --timeout $(( ${ONE_S:-250} - 30 )) )
    reap
    ( export CUDA_VISIBLE_DEVICES=0
      e2e one $(( $(left) - 10 )) --fast --ngram-processor $NGRAM $common --cache-dir /tmp/ocw-e2e-cache-9 \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --timeout $(( $(left) - 40 )) ) ;;
  all)  # one call for both issues: GPU 0 the daemon (a) with its processes' stacks sampled, GPU 1 (b) on the
        # same pages; then both GPUs as two replicas on twice the pages. GRAPHS=1: the encoder's CUDA graphs.
    graphs=${GRAPHS:+--encoder-graphs}
    ( export CUDA_VISIBLE_DEVICES=0
      e2e one ${LANE_S:-280} --fast $graphs --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-all \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --profile-at ${PROFILE_AT:-60} --profile-seconds 10 --timeout 230 ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      stock ${LANE_S:-280} ) &
    gpu1=$!
    wait $gpu0 $gpu1
    replicas /tmp/ocw-e2e-cache-all $graphs ;;
  six)  # run 6 (2026-11-29): GPU 0 tunes the fused-MoE tiles (quick space), then the daemon (a) with that file,
        # profiled inside its first wave, then (a) without the n-gram logits processor; GPU 1 (b) with the time
        # it needs (render 40 s + engine 105 s + 477 pages at ~3.7 pages/s)
    ( export CUDA_VISIBLE_DEVICES=0
      timeout -s INT -k 20 ${TUNE_S:-110} python3 bench/gpu/tune_moe.py --quick --reps 10 --out $R/moe-configs \
        --budget-s $(( ${TUNE_S:-110} - 25 )) 2>&1 | tee $R/tune_moe.log | grep --line-buffered -E "^M=[0-9]+:|wrote|shape"
      ls $R/moe-configs/E=*.json >/dev/null 2>&1 && export VLLM_TUNED_CONFIG_FOLDER=$R/moe-configs
      e2e one 215 --fast --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-all \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --profile-at ${PROFILE_AT:-12} --profile-seconds 10 --timeout 200
      e2e nongram $(( $(left) - 15 )) --fast --ngram-processor none $common --cache-dir /tmp/ocw-e2e-cache-all \
        --port 9464 --work /tmp/ocw-e2e-1 --phases a --timeout $(( $(left) - 40 )) ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      stock ${B_LANE_S:-470} ) &
    gpu1=$!
    wait $gpu0 $gpu1 ;;
  gr)  # run 7 (2026-11-29): the encoder's CUDA graphs against eager, both (a) at once on the same pages, one per
       # GPU, so both see the same host load; the MoE tiles come from the package (engine_env)
    ( export CUDA_VISIBLE_DEVICES=0
      e2e graphs $(( $(left) - 10 )) --fast --encoder-graphs --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-g \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --timeout $(( $(left) - 30 )) ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      e2e eager $(( $(left) - 10 )) --fast --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-e \
        --port 9465 --work /tmp/ocw-e2e-1 --phases a --timeout $(( $(left) - 30 )) ) &
    gpu1=$!
    wait $gpu0 $gpu1 ;;
  g)  # run 5 (2026-11-29): GPU 0 the daemon with the encoder's CUDA graphs (profiled), GPU 1 their equality
      # check; then both GPUs as two replicas
    ( export CUDA_VISIBLE_DEVICES=0
      e2e graphs 235 --fast --encoder-graphs --ngram-processor batched $common --cache-dir /tmp/ocw-e2e-cache-g \
        --port 9464 --work /tmp/ocw-e2e-0 --phases a --profile-at ${PROFILE_AT:-30} --profile-seconds 10 --timeout 200 ) &
    gpu0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      timeout -s INT -k 20 200 python3 bench/gpu/encoder_check.py --pages 3 --bench-pages 12 --reps 2 --impls concat --graphs \
        --out $R/encoder_check.jsonl 2>&1 | grep --line-buffered -v -E "incorrect regex|fix_mistral_regex|instantiate a model" \
        | tee $R/encoder_check.txt | cut -c1-300 ) &
    gpu1=$!
    wait $gpu0 $gpu1
    graphs=--encoder-graphs
    python3 -c "import json,sys; sys.exit(0 if json.load(open('$R/e2e_graphs.json')).get('a', {}).get('pages') else 1)" \
      || { graphs=; echo "graphs run gave no pages: replicas without graphs"; }
    replicas /tmp/ocw-e2e-cache-g $graphs ;;
  moe)  # the fused-MoE kernel's tiles for DeepSeek-OCR's experts on this GPU (bench/gpu/tune_moe.py), GPU 0
    export CUDA_VISIBLE_DEVICES=0
    timeout -s INT -k 20 $(( $(left) - 20 )) python3 bench/gpu/tune_moe.py --out $R/moe-configs \
      --budget-s $(( $(left) - 60 )) 2>&1 | tee $R/tune_moe.log | grep --line-buffered -E "^M=|wrote|shape|Error" ;;
  b)  # the official script's shape with vLLM's own class and n-gram processor, alone on GPU 0
    export CUDA_VISIBLE_DEVICES=0
    stock $(( $(left) - 25 )) ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
for d in $R/prof_*/; do [ -d "$d" ] && python3 bench/gpu/profsum.py "$d" --top 15 > "${d%/}.txt" 2>&1; done
python3 bench/gpu/summarize.py $R > $R/summary.md 2>&1; tail -40 $R/summary.md
echo "step $step: $(( $(date +%s) - t0 )) s"
