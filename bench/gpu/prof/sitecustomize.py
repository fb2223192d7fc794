"""A wall-clock stack sampler for every Python process of a benchmark run (the daemon, vLLM's engine core and
workers, which vLLM starts with `spawn`, so each runs this file on start when this folder is on PYTHONPATH).

py-spy cannot be relied on on the lent machine (its sandbox may refuse ptrace), so each process samples itself:
while the file $OCW_PROF_DIR/go exists, a daemon thread reads `sys._current_frames()` every 10 ms and counts
each thread's stack; when the file goes away it writes $OCW_PROF_DIR/<pid>-<title>.txt, one line per stack
("thread;outer;...;inner count", py-spy's raw format, so flame-graph tools read it).  A thread blocked in C
(a CUDA sync, a socket poll) shows the Python frame that called it, which is what a wall-clock profile wants.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter

PROF_DIR = os.environ.get("OCW_PROF_DIR")


def _title() -> str:
    try:
        with open(f"/proc/{os.getpid()}/comm") as handle:
            return handle.read().strip().replace("/", "_").replace(" ", "_") or "python"
    except OSError:
        return "python"


def _stack(frame) -> str:
    parts = []
    while frame is not None:
        code = frame.f_code
        parts.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
        frame = frame.f_back
    return ";".join(reversed(parts))


def _sample(go: str, interval: float = 0.01) -> None:
    me = threading.get_ident()
    while True:
        while not os.path.exists(go):
            time.sleep(0.25)
        counts: Counter[str] = Counter()
        started, n = time.monotonic(), 0
        while os.path.exists(go):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    counts[f"{names.get(ident, ident)};{_stack(frame)}"] += 1
            n += 1
            time.sleep(interval)
        out = os.path.join(PROF_DIR, f"{os.getpid()}-{_title()}.txt")
        with open(out, "w") as handle:
            handle.write(f"# samples={n} seconds={time.monotonic() - started:.1f} interval={interval}\n")
            for stack, count in counts.most_common():
                handle.write(f"{stack} {count}\n")


if PROF_DIR:
    threading.Thread(target=_sample, args=(os.path.join(PROF_DIR, "go"),), name="ocw-prof", daemon=True).start()
