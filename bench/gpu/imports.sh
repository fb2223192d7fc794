#!/usr/bin/env bash
# What the daemon's engine start pays in imports (_Runtime(): torch, vLLM and the API it uses), on the
# device: first with no bytecode (the bench's site is installed with --no-compile, so this run compiles and
# writes every .pyc it imports), then with it (what a user's `pip install` leaves), then the second way under
# `python -X importtime` ($R/importtime.txt, with its 30 slowest modules, cumulative, in importtime_top.txt).
set -uo pipefail
R=${RESULTS:-/tmp/ocw-results}
code='import time; t = time.time()
from ocrwatch.engines.deepseek.engine import _Runtime
_Runtime(); print(f"IMPORT {time.time() - t:.2f} s", flush=True)'
echo "[imports] no bytecode yet: $(python3 -c "$code")"
echo "[imports] with bytecode: $(python3 -c "$code")"
python3 -X importtime -c "$code" 2> $R/importtime.txt
echo "[imports] the slowest modules, cumulative microseconds:"
grep '^import time:' $R/importtime.txt | awk -F'|' '{gsub(/ /, "", $2); print $2, $3}' | sort -n -r | head -30 \
  | tee $R/importtime_top.txt | sed 's/^/[imports] /'
