"""The host cost of vLLM's repetition stop (``guard = "stop"``) a decode step: vLLM's own
``check_sequence_repetition``, which its scheduler calls for every running request after every
token, timed over ``--rows`` requests of random (never repeating) output, so every pattern size is
tried, as on a page that does not loop. Runs on a CPU; reads the function from the installed vLLM or
from a vLLM wheel (``--wheel``) without importing the rest of vLLM.

  python3 bench/gpu/repetition_cost.py \\
      --wheel /tmp/gpuwheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
"""

from __future__ import annotations

import argparse
import random
import time
import zipfile
from collections.abc import Callable
from typing import Any

MODULE = "vllm/v1/core/sched/utils.py"


def load(wheel: str | None) -> Callable[[Any, Any], bool]:
    """``check_sequence_repetition``, from the wheel's source with its two vLLM imports left out (it
    needs neither to run)."""
    if wheel is None:
        from vllm.v1.core.sched.utils import check_sequence_repetition

        return check_sequence_repetition
    source = zipfile.ZipFile(wheel).read(MODULE).decode()
    kept = [line for line in source.splitlines() if not line.startswith("from vllm")]
    names: dict[str, Any] = {}
    exec(compile("\n".join(kept), MODULE, "exec"), names)  # vLLM's own source, read from its wheel
    return names["check_sequence_repetition"]


class Params:
    """``RepetitionDetectionParams``' three fields."""

    def __init__(self, max_pattern_size: int, min_count: int) -> None:
        self.max_pattern_size, self.min_pattern_size, self.min_count = (
            max_pattern_size,
            0,
            min_count,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", default=None)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--patterns", default="16,32", help="stop_pattern values")
    ap.add_argument("--count", type=int, default=16, help="stop_count")
    ap.add_argument("--lengths", default="100,500,1000", help="output tokens a row so far")
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    check = load(a.wheel)
    rng = random.Random(0)
    longest = max(int(x) for x in a.lengths.split(","))
    rows = [[rng.randrange(129_280) for _ in range(longest)] for _ in range(a.rows)]
    for pattern in (int(x) for x in a.patterns.split(",")):
        params = Params(pattern, a.count)
        for length in (int(x) for x in a.lengths.split(",")):
            views = [row[:length] for row in rows]
            runs = []
            for _ in range(3):  # the least of three: a shared machine's noise only adds
                started = time.perf_counter()
                for _ in range(a.steps):
                    for view in views:
                        check(view, params)
                runs.append((time.perf_counter() - started) / a.steps * 1e3)
            ms = min(runs)
            print(
                f"stop_pattern {pattern}, stop_count {a.count}, {length} tokens a row, {a.rows} "
                "rows: "
                f"{ms:.2f} ms a step"
            )


if __name__ == "__main__":
    main()
