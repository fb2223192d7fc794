"""How far two runs' greedy output ids agree, page by page (engine_bench.py --tokens-out files):
pages equal to the end, and the mean and least length of the common prefix.

  python3 bench/gpu/runners_tokens.py tokens_v1.json tokens_v2.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    common = [prefix(x, y) for x, y in zip(a, b, strict=False)]
    equal = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    return {
        "pages": len(common),
        "equal_pages": equal,
        "mean_common_prefix": round(sum(common) / len(common), 1) if common else None,
        "least_common_prefix": min(common) if common else None,
        "tokens_per_page": round(sum(map(len, a)) / len(a), 1) if a else None,
    }


if __name__ == "__main__":
    try:
        loaded = [json.loads(Path(path).read_text()) for path in sys.argv[1:3]]
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(0)
    print(json.dumps(compare(*loaded)))
