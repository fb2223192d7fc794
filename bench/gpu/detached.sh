#!/usr/bin/env bash
# A measurement longer than one device call, on the same warm machine: the step runs in a process session of
# its own (the device ends a call's other processes when it returns), and a later call waits for it and
# collects its output.
#   bash bench/gpu/detached.sh start SECONDS CMD...   start CMD (e.g. bash bench/gpu/compare.sh), then follow its
#                                                      log for SECONDS and return, CMD still running
#   bash bench/gpu/detached.sh wait SECONDS            follow the log until CMD ends or SECONDS pass, then copy
#                                                      what it left in /tmp/ocw-out to $OUT and, while it still
#                                                      runs, its results so far as $OUT/partial.tgz
# The step's own OUT is /tmp/ocw-out (a call's $OUT is emptied before the next call). Call `wait` within the
# machine's idle time after `start` returns (30 s on the lent H200), or the machine goes back with the step.
set -uo pipefail
D=/tmp/ocw-detached; mkdir -p $D
verb=${1:?start or wait}; seconds=${2:?seconds}; shift 2
follow() {  # print the log as it grows, until the step ends or the time is up
  local end=$(( $(date +%s) + seconds )) from=$(cat $D/shown 2>/dev/null || echo 0)
  while :; do
    local size; size=$(stat -c %s $D/log 2>/dev/null || echo 0)
    if [ "$size" -gt "$from" ]; then tail -c +$(( from + 1 )) $D/log | head -c $(( size - from )); from=$size; fi
    echo "$from" > $D/shown
    [ -e $D/rc ] && { echo "detached step ended: rc $(cat $D/rc)"; return 0; }
    [ "$(date +%s)" -ge "$end" ] && { echo "detached step still running"; return 1; }
    sleep 2
  done
}
case $verb in
  start)
    rm -f $D/rc $D/log $D/shown
    # setsid: a session of its own outlives this call; the step writes its results under /tmp/ocw-out.
    # Its own output goes nowhere: holding the caller's stdout would keep a `start | tail` waiting for it.
    OUT=/tmp/ocw-out setsid bash -c '"$@" > '$D'/log 2>&1 < /dev/null; echo $? > '$D'/rc' step "$@" \
      > /dev/null 2>&1 < /dev/null &
    follow ;;
  wait)
    follow; rc=$?
    # What exists goes back with every call, finished or not: the machine may not last to the next one.
    if [ "${OUT:-/tmp/ocw-out}" != /tmp/ocw-out ]; then
      mkdir -p "$OUT"; cp -r /tmp/ocw-out/. "$OUT/" 2>/dev/null
      [ $rc = 0 ] || tar czf "$OUT/partial.tgz" -C "${RESULTS:-/tmp/ocw-results}" --exclude 'series_*' . 2>/dev/null
    fi
    exit $rc ;;
  *) echo "unknown verb $verb"; exit 2 ;;
esac
