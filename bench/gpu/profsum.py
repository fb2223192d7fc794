"""Summarise the stack samples of prof/sitecustomize.py: per process and thread, the share of samples spent in
each innermost frame (self) and under each frame (inclusive).

    python bench/gpu/profsum.py DIR [--top 25] [--match engine_core]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

IDLE = ("wait (threading.py", "_worker (thread.py", "select (selectors.py", "_check_inotify_fd", "get (queue.py",
        "poll (", "recv_multipart (", "sleep (", "_do_waitpid (", "run (garbage.py")
"""Innermost frames of a thread that waits for work; a thread that does nothing else is not printed."""


def read(path: Path) -> tuple[str, dict[str, Counter[str]], dict[str, Counter[str]], dict[str, int]]:
    header = ""
    self_: dict[str, Counter[str]] = defaultdict(Counter)
    incl: dict[str, Counter[str]] = defaultdict(Counter)
    totals: dict[str, int] = Counter()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            header = line
            continue
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        n = int(count)
        totals[thread] += n
        if frames:
            self_[thread][frames[-1]] += n
            for frame in set(frames):
                incl[thread][frame] += n
    return header, self_, incl, totals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--min-share", type=float, default=0.05, help="threads busy less than this share of their samples are skipped")
    a = ap.parse_args()
    for path in sorted(p for p in Path(a.dir).glob("*.txt") if not p.name.startswith("pyspy_")):  # dumps: read as-is
        header, self_, incl, totals = read(path)
        print(f"## {path.name} {header}")
        busy = {t: total - sum(n for f, n in self_[t].items() if f.startswith(IDLE)) for t, total in totals.items()}
        for thread, total in sorted(totals.items(), key=lambda kv: -busy[kv[0]]):
            if busy[thread] < a.min_share * total:
                continue
            print(f"### thread {thread}: {total} samples, {100 * busy[thread] / total:.0f}% not waiting")
            print("self:")
            for frame, n in self_[thread].most_common(a.top):
                print(f"  {100 * n / total:5.1f}%  {frame}")
            print("inclusive:")
            for frame, n in incl[thread].most_common(a.top):
                print(f"  {100 * n / total:5.1f}%  {frame}")
        print()


if __name__ == "__main__":
    main()
